//! Fuzzes every decoder that reads bytes from a peer: the data-frame header, control
//! messages (with a re-encode round trip), the handshake hellos, and the restart journal.
//! The invariants live in `hsxfer::channels::check_decoders` so unit tests run them too.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hsxfer::channels::check_decoders(data));
