//! `hsxfer._native`: the Rust half of the Python package (`python/hsxfer/__init__.py` is the
//! documented face).
//!
//! Every transfer runs on one tokio runtime shared by the process. The calling thread waits
//! for it with the GIL released, in steps of the progress interval; between steps it calls
//! the progress callback and checks for Ctrl-C. A callback that raises, or Ctrl-C, stops the
//! transfer: its sockets close, and the server keeps the partial files and their journals,
//! so the same call later resumes.

use std::ffi::CString;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hsxfer::fsio::operands::{self, Direction};
use hsxfer::probe::{Direction as ProfileDirection, Fixed, ProbeOptions};
use hsxfer::session::events::Event;
use hsxfer::session::secure::Security;
use hsxfer::session::settle::{settle, Source};
use hsxfer::transport::tls::Fingerprint;
use hsxfer::tuning::desync::PaceChoice;
use hsxfer::{
    Auth, BenchAmount, BenchDirection, Client, LiveStats, PathRate, Server, Stopper,
    TransferOptions, TransferReport,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

create_exception!(
    hsxfer,
    Error,
    PyException,
    "A transfer, probe or server failed; the message says what went wrong and what to do."
);
create_exception!(
    hsxfer,
    AuthError,
    Error,
    "The server refused the token, or could not prove it holds it."
);
create_exception!(
    hsxfer,
    ConnectError,
    Error,
    "The server could not be reached, or is not an hsxfer server."
);
create_exception!(
    hsxfer,
    TransientError,
    Error,
    "The same call made again later may succeed, and resumes where this one stopped: the server was busy or stopping, the connection dropped, or a step timed out."
);
create_exception!(
    hsxfer,
    BusyError,
    TransientError,
    "The server is at one of its session caps: retry later."
);

/// The library's messages name a few options as Rust items, and each as Python sets it.
const KEYWORDS: &[(&str, &str)] = &[
    ("`Security::Clear`", "`encrypt=False`"),
    ("`ServerBuilder::allow_clear`", "`allow_clear=True`"),
    ("`Trust::Pinned`", "`server_fingerprint`"),
    (
        "`ServerLimits::sessions_per_address`",
        "`hsxfer serve --max-sessions-per-address`",
    ),
    ("`ServerLimits::sessions`", "`hsxfer serve --max-sessions`"),
    (
        "`ServerLimits::channels_per_address`",
        "`hsxfer serve --max-channels-per-address`",
    ),
    ("`ServerLimits::channels`", "`hsxfer serve --max-channels`"),
];

/// `text` with the Rust items it names as options replaced by Python's keywords.
fn as_keywords(text: &str) -> String {
    KEYWORDS
        .iter()
        .fold(text.to_string(), |t, (item, keyword)| {
            t.replace(item, keyword)
        })
}

/// The library's error as the Python exception of its kind, with the same one-line message.
fn raise(e: hsxfer::Error) -> PyErr {
    use hsxfer::Error as E;
    let message = as_keywords(&e.to_string());
    match e {
        E::AuthRefused(_) | E::ServerNotAuthentic(_) | E::ServerKeyChanged { .. } => {
            AuthError::new_err(message)
        }
        E::Resolve { .. }
        | E::Connect { .. }
        | E::NotHsxfer(_)
        | E::ClearRefused(_)
        | E::Tls { .. } => ConnectError::new_err(message),
        E::Busy { .. } => BusyError::new_err(message),
        e if e.is_transient() => TransientError::new_err(message),
        E::Usage(_) => PyValueError::new_err(message),
        _ => Error::new_err(message),
    }
}

/// The process's one runtime, started on first use, and again in a child forked after that
/// (`multiprocessing`'s workers on Linux): a child has the parent's runtime but none of its
/// threads, so work handed to it never ran and its timers never fired (every call hung, deaf
/// to Ctrl-C). The parent's is left alone there: dropping it would wait for those threads.
fn runtime() -> &'static Runtime {
    static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut current = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    match *current {
        Some((owner, rt)) if owner == pid => rt,
        _ => {
            let rt: &'static Runtime = Box::leak(Box::new(
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("hsxfer")
                    .build()
                    .expect("a tokio runtime"),
            ));
            *current = Some((pid, rt));
            rt
        }
    }
}

/// A token file, or no authentication (which servers allow only on loopback).
fn auth(token_file: Option<PathBuf>) -> PyResult<Auth> {
    Auth::from_optional_token_file(token_file.as_deref()).map_err(raise)
}

/// TLS with the server's key checked against the known-servers file (the default one, or
/// `known_servers`) or pinned to `server_fingerprint`, or clear text without `encrypt`.
fn security(
    encrypt: bool,
    server_fingerprint: Option<String>,
    known_servers: Option<PathBuf>,
) -> PyResult<Security> {
    let pinned = server_fingerprint
        .map(|f| f.parse::<Fingerprint>())
        .transpose()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Security::choose(encrypt, pinned, known_servers).map_err(raise)
}

/// A name from the library's serde vocabulary (`"push"`, `"fair"`, …).
fn named<T: DeserializeOwned>(what: &str, value: &str) -> PyResult<T> {
    serde_json::from_value(serde_json::Value::String(value.into()))
        .map_err(|_| PyValueError::new_err(format!("{what} {value:?} is not one of the choices")))
}

/// Serializes a report for `json.loads` on the Python side.
fn json<T: serde::Serialize>(value: &T) -> PyResult<String> {
    serde_json::to_string(value).map_err(|e| Error::new_err(format!("report: {e}")))
}

/// What the progress callback gets.
fn snapshot<'py>(py: Python<'py>, live: &LiveStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes", live.total())?;
    d.set_item("expected", live.expected())?;
    d.set_item("files_done", live.files_done())?;
    d.set_item("seconds", live.elapsed())?;
    d.set_item("channels", live.channel_bytes())?;
    Ok(d)
}

/// How often a transfer's caller looks for Ctrl-C, even when progress comes less often.
const SIGNAL_CHECK: Duration = Duration::from_millis(200);

/// Runs `work` to its end with the GIL released, calling `progress` every `interval`; a
/// callback that raises, or Ctrl-C, aborts the work and raises in the caller.
fn drive<T: Send + 'static>(
    py: Python<'_>,
    work: impl Future<Output = hsxfer::Result<T>> + Send + 'static,
    live: &LiveStats,
    progress: Option<&Bound<'_, PyAny>>,
    interval: f64,
) -> PyResult<T> {
    if !(0.01..=3600.0).contains(&interval) {
        return Err(PyValueError::new_err(format!(
            "interval {interval} is out of range: use 0.01 to 3600 seconds"
        )));
    }
    let step = Duration::from_secs_f64(interval);
    let rt = runtime();
    let mut task = rt.spawn(work);
    let mut next_progress = Instant::now() + step;
    loop {
        // Ctrl-C is looked for at least every SIGNAL_CHECK, whatever the interval.
        let wait = next_progress
            .saturating_duration_since(Instant::now())
            .min(SIGNAL_CHECK);
        // The timer must be made inside the runtime.
        let waited =
            py.detach(|| rt.block_on(async { tokio::time::timeout(wait, &mut task).await }));
        if let Ok(joined) = waited {
            let value = joined
                .map_err(hsxfer::Error::task("the transfer"))
                .and_then(|r| r)
                .map_err(raise)?;
            // The transfer is done: an exception from its last progress call cannot stop it,
            // and must not lose its report. Python reports it as it does one from `__del__`;
            // Ctrl-C (and the like, not an `Exception`) still propagates.
            if let Some(cb) = progress {
                if let Err(e) = snapshot(py, live).and_then(|p| cb.call1((p,))) {
                    if !e.is_instance_of::<PyException>(py) {
                        return Err(e);
                    }
                    e.write_unraisable(py, Some(cb));
                }
            }
            return Ok(value);
        }
        let due = Instant::now() >= next_progress;
        if due {
            next_progress = Instant::now() + step;
        }
        let asked_to_stop = py.check_signals().and_then(|()| match progress {
            Some(cb) if due => cb.call1((snapshot(py, live)?,)).map(drop),
            _ => Ok(()),
        });
        if let Err(e) = asked_to_stop {
            task.abort();
            let _ = py.detach(|| rt.block_on(&mut task));
            return Err(e);
        }
    }
}

/// Transfer options from the Python keywords; `None` keeps the library's default.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct Options {
    channels: Option<u16>,
    port: u16,
    token_file: Option<PathBuf>,
    block_size: Option<u32>,
    cc: Vec<String>,
    rate: Option<u64>,
    pace: Option<u64>,
    tune: String,
    policy: String,
    mptcp: bool,
    mptcp_paths: String,
    encrypt: bool,
    server_fingerprint: Option<String>,
    known_servers: Option<PathBuf>,
}

/// A transfer's options, where the rest of its settings come from, and what the caller fixed
/// (a saved profile leaves that alone).
struct Planned {
    opts: TransferOptions,
    source: Source,
    fixed: Fixed,
}

impl Options {
    /// Like the command line: a given channel count is also the most the tuner may run.
    fn plan(self) -> PyResult<Planned> {
        let d = TransferOptions::default();
        let source: Source = self
            .tune
            .parse()
            .map_err(|e| PyValueError::new_err(format!("tune {:?}: {e}", self.tune)))?;
        let fixed = Fixed {
            channels: self.channels.is_some(),
            cc: !self.cc.is_empty(),
            pace: self.pace.is_some(),
            rate: self.rate.is_some(),
        };
        let opts = TransferOptions {
            channels: self.channels.unwrap_or(d.channels),
            max_channels: self.channels.unwrap_or(d.max_channels),
            block_size: self.block_size.unwrap_or(d.block_size),
            port: self.port,
            auth: auth(self.token_file)?,
            cc: self.cc,
            rate: self.rate.map_or(PathRate::Unknown, PathRate::Given),
            pace: self.pace.map_or(d.pace, |bits| PaceChoice::Fixed(bits / 8)),
            policy: named("policy", &self.policy)?,
            mptcp: self.mptcp,
            mptcp_paths: self
                .mptcp_paths
                .parse()
                .map_err(|e| PyValueError::new_err(format!("mptcp_paths: {e}")))?,
            security: security(self.encrypt, self.server_fingerprint, self.known_servers)?,
            ..d
        };
        opts.validate().map_err(raise)?;
        Ok(Planned {
            opts,
            source,
            fixed,
        })
    }
}

/// What a transfer yields: its report or error, and warnings for Python's `warnings` module,
/// which are issued whichever it is.
type Outcome = (hsxfer::Result<TransferReport>, Vec<String>);

/// Runs one operation of a client to `host` after settling its options against the saved
/// profile of the server and `direction` (or a probe, or neither), and saves what a long
/// enough transfer learned, as `hsxfer copy` does.
async fn settled<F, Fut>(
    host: String,
    plan: Planned,
    direction: ProfileDirection,
    live: Arc<LiveStats>,
    run: F,
) -> hsxfer::Result<Outcome>
where
    F: FnOnce(Client, Arc<LiveStats>) -> Fut,
    Fut: Future<Output = hsxfer::Result<TransferReport>>,
{
    let Planned {
        mut opts,
        source,
        fixed,
    } = plan;
    let port = opts.port;
    let (profiled, done) = settle(source, &mut opts, fixed, (&host, port), direction).await?;
    let mut warnings = done.warnings;
    if let Some((_, Err(e))) = &done.probe {
        warnings.push(e.to_string());
    }
    live.ensure_channels(opts.channels as usize);
    let report = run(Client::new(&host, opts), live.clone()).await;
    match &report {
        Ok(report) => {
            if let Err(e) = profiled.learn(report) {
                warnings.push(e.to_string());
            }
        }
        // The set-up's notes, which a report would have carried (files passed over, limits
        // met, a server key recorded).
        Err(_) => warnings.extend(live.notes()),
    }
    Ok((report, warnings))
}

/// The report as JSON (or the transfer's error raised), after handing the warnings to
/// Python's `warnings` module.
/// A warning turned into an exception (`-W error`) does not hide a failed transfer's error.
fn finish(py: Python<'_>, (report, warnings): Outcome) -> PyResult<String> {
    for w in warnings {
        let text = CString::new(as_keywords(&w))?;
        let warned = PyErr::warn(py, &py.get_type::<PyUserWarning>(), &text, 1);
        if report.is_ok() {
            warned?;
        }
    }
    // The summary event's object, `type` and `schema` included, as docs/json.md gives it.
    json(&Event::summary(&report.map_err(raise)?))
}

/// `copy(operands, options)`: the last operand is the destination; `HOST:PATH` operands are
/// remote, as with `hsxfer copy`. `expect` ("push" or "pull") refuses the other direction.
#[pyfunction]
#[pyo3(signature = (operands, options, *, recursive, expect=None, progress=None, interval=0.5))]
fn copy(
    py: Python<'_>,
    operands: Vec<String>,
    options: Options,
    recursive: bool,
    expect: Option<&str>,
    progress: Option<&Bound<'_, PyAny>>,
    interval: f64,
) -> PyResult<String> {
    let direction = operands::direction(&operands).map_err(PyValueError::new_err)?;
    let plan = options.plan()?;
    let live = Arc::new(LiveStats::default());
    let l = live.clone();
    let outcome = match direction {
        Direction::Push {
            host,
            sources,
            dest,
        } => {
            if expect == Some("pull") {
                return Err(PyValueError::new_err(
                    "pull: the sources must be remote (HOST:PATH) and the destination local",
                ));
            }
            let sources: Vec<PathBuf> = sources.into_iter().map(PathBuf::from).collect();
            let work = settled(
                host,
                plan,
                ProfileDirection::Push,
                l,
                move |c, l| async move { c.push(&sources, recursive, &dest, &l).await },
            );
            drive(py, work, &live, progress, interval)?
        }
        Direction::Pull {
            host,
            sources,
            dest,
        } => {
            if expect == Some("push") {
                return Err(PyValueError::new_err(
                    "push: the sources must be local and the destination remote (HOST:PATH)",
                ));
            }
            let work = settled(
                host,
                plan,
                ProfileDirection::Pull,
                l,
                move |c, l| async move { c.pull(&sources, recursive, &dest, &l).await },
            );
            drive(py, work, &live, progress, interval)?
        }
    };
    finish(py, outcome)
}

/// `bench(host, options)`: generated data through the whole protocol, discarded on arrival.
#[pyfunction]
#[pyo3(name = "bench", signature = (host, options, *, direction="upload", bytes=None, seconds=None, progress=None, interval=0.5))]
#[allow(clippy::too_many_arguments)] // the Python keywords, one by one
fn bench_memory(
    py: Python<'_>,
    host: String,
    options: Options,
    direction: &str,
    bytes: Option<u64>,
    seconds: Option<f64>,
    progress: Option<&Bound<'_, PyAny>>,
    interval: f64,
) -> PyResult<String> {
    let direction: BenchDirection = named("direction", direction)?;
    let amount = match (bytes, seconds) {
        (Some(b), None) => BenchAmount::Bytes(b),
        (None, Some(s)) => BenchAmount::Seconds(s),
        _ => {
            return Err(PyValueError::new_err(
                "bench: give bytes or seconds, not both",
            ))
        }
    };
    let way = match direction {
        BenchDirection::Upload => ProfileDirection::Push,
        BenchDirection::Download => ProfileDirection::Pull,
    };
    let plan = options.plan()?;
    let live = Arc::new(LiveStats::default());
    let work = settled(host, plan, way, live.clone(), move |c, l| async move {
        c.bench(direction, amount, &l).await
    });
    let outcome = drive(py, work, &live, progress, interval)?;
    finish(py, outcome)
}

/// `probe(host, …)`: measures the path and ranks configurations within `budget` seconds
/// (`None`: 10, or the least the path needs where that is more);
/// with `save`, keeps the profile for later copies to this server (as `hsxfer probe` does).
/// Returns the report as JSON with `profile`, the saved file (or null).
#[pyfunction]
#[pyo3(signature = (host, *, port, token_file=None, budget=None, direction="push", policy="fair", save=true, encrypt=true, server_fingerprint=None, known_servers=None, mptcp=false))]
#[allow(clippy::too_many_arguments)] // the Python keywords, one by one
fn probe(
    py: Python<'_>,
    host: String,
    port: u16,
    token_file: Option<PathBuf>,
    budget: Option<f64>,
    direction: &str,
    policy: &str,
    save: bool,
    encrypt: bool,
    server_fingerprint: Option<String>,
    known_servers: Option<PathBuf>,
    mptcp: bool,
) -> PyResult<String> {
    if let Some(budget) = budget.filter(|b| !(0.0..=86_400.0).contains(b)) {
        return Err(PyValueError::new_err(format!(
            "budget {budget} is out of range: use 0 to 86400 seconds"
        )));
    }
    let opts = ProbeOptions {
        port,
        auth: auth(token_file)?,
        security: security(encrypt, server_fingerprint, known_servers)?,
        budget: budget.map(Duration::from_secs_f64),
        direction: named("direction", direction)?,
        policy: named("policy", policy)?,
        mptcp,
    };
    let h = host.clone();
    let work = async move { hsxfer::probe::probe(&h, &opts, &|_| {}).await };
    let report = drive(py, work, &LiveStats::new(0), None, 0.2)?;
    let saved = match save.then(|| report.save_profile(&host, port)).flatten() {
        Some(saved) => Some(saved.map_err(|e| raise(e.into()))?),
        None => None,
    };
    let mut value =
        serde_json::to_value(&report).map_err(|e| Error::new_err(format!("report: {e}")))?;
    value["profile"] = serde_json::json!(saved.map(|p| p.display().to_string()));
    Ok(value.to_string())
}

/// A server on this process's runtime, serving until [`ServerHandle::close`].
#[pyclass(module = "hsxfer._native", name = "Server")]
struct ServerHandle {
    address: SocketAddr,
    fingerprint: String,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<hsxfer::Result<()>>>>,
    stopper: Stopper,
}

#[pymethods]
impl ServerHandle {
    /// Binds `listen`:`port` (port 0: a free one) and starts serving `root`.
    #[new]
    #[pyo3(signature = (root, *, token_file=None, listen="127.0.0.1", port=0, mptcp=false, key_file=None, allow_clear=false))]
    #[allow(clippy::too_many_arguments)] // the Python keywords, one by one
    fn new(
        py: Python<'_>,
        root: PathBuf,
        token_file: Option<PathBuf>,
        listen: &str,
        port: u16,
        mptcp: bool,
        key_file: Option<PathBuf>,
        allow_clear: bool,
    ) -> PyResult<Self> {
        let ip: IpAddr = listen.parse().map_err(|_| {
            PyValueError::new_err(format!("listen address {listen:?} is not an IP address"))
        })?;
        let mut builder = Server::builder(root).listen(ip).port(port).mptcp(mptcp);
        if let Some(t) = token_file {
            builder = builder.token_file(t);
        }
        if let Some(k) = key_file {
            builder = builder.key_file(k);
        }
        builder = builder.allow_clear(allow_clear);
        let rt = runtime();
        let server = py.detach(|| rt.block_on(builder.bind()).map_err(raise))?;
        let address = server.local_addr();
        let fingerprint = server.fingerprint().to_string();
        let stopper = server.stopper();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = rt.spawn(async move {
            tokio::select! {
                r = server.run() => r,
                _ = stopped => Ok(()),
            }
        });
        Ok(ServerHandle {
            address,
            fingerprint,
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
            stopper,
        })
    }

    /// The port it listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.address.port()
    }

    /// The fingerprint of its TLS key, which clients pin (`SHA256:...`).
    #[getter]
    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    /// The address it listens on, as `IP:PORT`.
    #[getter]
    fn address(&self) -> String {
        self.address.to_string()
    }

    /// Ends the sessions running, telling each client `why` and to run its copy again once
    /// the server is back (waits at most 3 s), then closes.
    fn stop(&self, py: Python<'_>, why: &str) -> PyResult<()> {
        py.detach(|| runtime().block_on(self.stopper.stop(why)));
        self.close(py)
    }

    /// Stops accepting connections (sessions already running end on their own). Raises
    /// if the server had failed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(stop) = self.stop.lock().expect("server lock").take() {
            let _ = stop.send(());
        }
        let Some(task) = self.task.lock().expect("server lock").take() else {
            return Ok(());
        };
        py.detach(|| runtime().block_on(task))
            .map_err(hsxfer::Error::task("the server"))
            .and_then(|served| served)
            .map_err(raise)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.get_mut().ok().and_then(Option::take) {
            let _ = stop.send(());
        }
    }
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(copy, m)?)?;
    m.add_function(wrap_pyfunction!(bench_memory, m)?)?;
    m.add_function(wrap_pyfunction!(probe, m)?)?;
    m.add_class::<ServerHandle>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("TransientError", py.get_type::<TransientError>())?;
    m.add("BusyError", py.get_type::<BusyError>())?;
    m.add("DEFAULT_PORT", hsxfer::DEFAULT_PORT)?;
    Ok(())
}
