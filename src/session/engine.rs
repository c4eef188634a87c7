//! What the sending and receiving engines share: how a session ends.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::{JoinError, JoinSet};

use super::report::SideOutcome;
use super::wire::{ControlReader, ControlWriter};
use crate::channels::control::Message;
use crate::error::{Error, Result};

/// How long an engine whose data channel broke waits for the peer's reason on the control
/// connection: a peer that fails sends its abort and drops its data channels at once, and
/// the reset of a channel can arrive first.
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A failure that looks like the peer vanishing becomes the peer's own reason when the
/// control connection brings one (a full disk on the other end, say) within [`ABORT_GRACE`].
async fn peer_reason<R: AsyncRead + Unpin>(e: Error, ctrl_r: &mut ControlReader<R>) -> Error {
    if !matches!(e, Error::PeerVanished) {
        return e;
    }
    let reason = async {
        loop {
            match ctrl_r.recv().await {
                Ok(Some(Message::Abort { message })) => return Some(message),
                Ok(Some(_)) => continue,
                _ => return None,
            }
        }
    };
    match tokio::time::timeout(ABORT_GRACE, reason).await {
        Ok(Some(message)) => Error::PeerAborted(message),
        _ => e,
    }
}

/// The outcome of a finished data-channel task, as an error if it failed or panicked.
pub fn channel_ended(r: Result<Result<()>, JoinError>) -> Result<()> {
    r.map_err(|e| Error::Malformed(format!("channel task failed: {e}")))?
}

/// Ends an engine: on success waits for every channel task to finish cleanly; on failure
/// gives the peer's own reason if it sent one ([`peer_reason`]), tells the peer why and
/// stops the channels.
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
            let e = peer_reason(e, ctrl_r).await;
            ctrl_w.abort(&e).await;
            tasks.abort_all();
            Err(e)
        }
    }
}
