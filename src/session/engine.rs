//! What the sending and receiving engines share: how a session ends.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinSet};

use super::report::SideOutcome;
use super::wire::{ControlReader, ControlWriter};
use crate::channels::control::Message;
use crate::error::{Error, Result};

/// Why the server is stopping, once it is ([`super::server::Stopper`]): an engine that
/// watches it ends its session with [`Error::Stopping`], which tells the peer.
pub type StopWatch = watch::Receiver<Option<String>>;

/// Resolves with the reason once the server stops; never without a watch (a client's
/// engine).
pub async fn stopped(w: &mut Option<StopWatch>) -> Error {
    let Some(w) = w.as_mut() else {
        return std::future::pending().await;
    };
    let why = w
        .wait_for(Option::is_some)
        .await
        .map(|why| why.clone().unwrap_or_default());
    match why {
        Ok(why) => Error::Stopping(why),
        // The server is gone: nothing will say why.
        Err(_) => std::future::pending().await,
    }
}

/// How long an engine whose data channel broke waits for the real cause: a peer that fails
/// sends its abort and drops its data channels at once, and the reset of a channel can
/// arrive first; a channel of this end that fails drops its stream before its error is seen.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A failure that looks like the peer vanishing becomes the real cause when one shows up
/// within [`ABORT_GRACE`]: a data channel of this end failing for a local reason (a full
/// disk, say: the failing channel drops its stream, the peer closes the others, and their
/// clean ends can be seen before the failure itself), or the peer's own reason on the
/// control connection. A local cause comes first.
async fn real_cause<R: AsyncRead + Unpin>(
    e: Error,
    ctrl_r: &mut ControlReader<R>,
    tasks: &mut JoinSet<Result<()>>,
) -> Error {
    if !matches!(e, Error::PeerVanished) {
        return e;
    }
    let deadline = tokio::time::sleep(ABORT_GRACE);
    tokio::pin!(deadline);
    let (mut tasks_open, mut ctrl_open) = (true, true);
    while tasks_open || ctrl_open {
        tokio::select! {
            biased;
            r = tasks.join_next(), if tasks_open => match r.map(channel_ended) {
                None => tasks_open = false,
                Some(Ok(()) | Err(Error::PeerVanished)) => {}
                Some(Err(local)) => return local,
            },
            m = ctrl_r.recv(), if ctrl_open => match m {
                Ok(Some(Message::Abort { message, transient })) => {
                    return Error::PeerAborted { message, transient }
                }
                Ok(Some(_)) => {}
                _ => ctrl_open = false,
            },
            _ = &mut deadline => break,
        }
    }
    e
}

/// The outcome of a finished data-channel task, as an error if it failed or panicked.
pub fn channel_ended(r: Result<Result<()>, JoinError>) -> Result<()> {
    r.map_err(Error::task("a data channel"))?
}

/// Ends an engine: on success waits for every channel task to finish cleanly; on failure
/// finds the real cause if the failure looked like the peer vanishing (`real_cause`),
/// tells the peer why and stops the channels.
pub async fn conclude<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    result: Result<SideOutcome>,
    ctrl_r: &mut ControlReader<R>,
    ctrl_w: &mut ControlWriter<W>,
    mut tasks: JoinSet<Result<()>>,
) -> Result<SideOutcome> {
    match result {
        Ok(out) => {
            while let Some(r) = tasks.join_next().await {
                channel_ended(r)?;
            }
            Ok(out)
        }
        Err(e) => {
            let e = real_cause(e, ctrl_r, &mut tasks).await;
            ctrl_w.abort(&e).await;
            tasks.abort_all();
            Err(e)
        }
    }
}
