//! What the sending and receiving engines share: how a session ends.

use tokio::io::AsyncWrite;
use tokio::task::{JoinError, JoinSet};

use super::report::SideOutcome;
use super::wire::ControlWriter;
use crate::error::{Error, Result};

/// The outcome of a finished data-channel task, as an error if it failed or panicked.
pub fn channel_ended(r: Result<Result<()>, JoinError>) -> Result<()> {
    r.map_err(|e| Error::Malformed(format!("channel task failed: {e}")))?
}

/// Ends an engine: on success waits for every channel task to finish cleanly; on failure
/// tells the peer why and stops the channels.
pub async fn conclude<W: AsyncWrite + Unpin>(
    result: Result<SideOutcome>,
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
            ctrl_w.abort(&e).await;
            tasks.abort_all();
            Err(e)
        }
    }
}
