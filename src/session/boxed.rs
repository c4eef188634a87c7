//! The future a public `async` entry point hands back, boxed where it is made.
//!
//! The body of a public `async fn` is compiled where it is awaited: in every crate that
//! calls it (the command line, each test and example, the Python module) the whole session
//! beneath it is compiled again. An entry point that returns its future as a boxed
//! `dyn Future` is compiled once, in this crate, and a caller compiles only the box's poll:
//! the push example went from 128,611 lines of LLVM IR to 12,466 (`cargo llvm-lines`).
//! One allocation per call, and one indirect call per poll, is nothing beside a transfer.

use std::future::Future;
use std::pin::Pin;

/// Boxes `f` here, so that its body is compiled in this crate.
pub(super) fn boxed<'a, T>(
    f: impl Future<Output = T> + Send + 'a,
) -> Pin<Box<dyn Future<Output = T> + Send + 'a>> {
    Box::pin(f)
}
