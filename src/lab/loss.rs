//! Random loss on the data direction: a six-instruction XDP program that drops a packet when
//! a random 32-bit number falls below a threshold, attached to the router's sender-facing
//! veths. XDP runs before GRO merges packets, so each wire packet is dropped on its own (a
//! netfilter `statistic` rule after GRO would drop whole merged bursts). The program is
//! built here as bytecode, so no compiler is needed; the attachment lives as long as the
//! returned link descriptors (the delay element holds them).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;
const HELPER_GET_PRANDOM_U32: i32 = 7;

/// One eBPF instruction in its wire form.
fn insn(code: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = regs;
    b[2..4].copy_from_slice(&off.to_ne_bytes());
    b[4..8].copy_from_slice(&imm.to_ne_bytes());
    b
}

/// The largest random value that means "drop" for loss probability `p` (0 < p < 0.5).
pub fn threshold(p: f64) -> u32 {
    ((p * 4_294_967_296.0).round() as u64).saturating_sub(1) as u32
}

/// The program: `r0 = random(); if r0 > T return PASS; return DROP`.
pub fn program(p: f64) -> Vec<u8> {
    let t = threshold(p) as i32;
    [
        insn(0x85, 0, 0, HELPER_GET_PRANDOM_U32), // call bpf_get_prandom_u32
        insn(0x25, 0, 2, t),                      // if r0 > T goto pass (unsigned)
        insn(0xb7, 0, 0, XDP_DROP),               // r0 = XDP_DROP
        insn(0x95, 0, 0, 0),                      // exit
        insn(0xb7, 0, 0, XDP_PASS),               // pass: r0 = XDP_PASS
        insn(0x95, 0, 0, 0),                      // exit
    ]
    .concat()
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a zero-padded bpf_attr of the size passed; pointers inside it refer to
    // buffers that outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Loads the program and attaches it to each interface (names in the caller's namespace).
/// Returns the links: dropping them detaches the program.
pub fn attach(p: f64, devices: &[String]) -> io::Result<Vec<OwnedFd>> {
    use std::os::fd::AsRawFd;
    let code = program(p);
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&((code.len() / 8) as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[24..28].copy_from_slice(&1u32.to_ne_bytes());
    attr[28..32].copy_from_slice(&(log.len() as u32).to_ne_bytes());
    attr[32..40].copy_from_slice(&(log.as_mut_ptr() as u64).to_ne_bytes());
    attr[48..56].copy_from_slice(b"hsx_loss");
    attr[68..72].copy_from_slice(&BPF_XDP.to_ne_bytes());
    let prog = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let text = String::from_utf8_lossy(&log);
        io::Error::new(
            e.kind(),
            format!(
                "loading the loss program: {e}: {}",
                text.trim_end_matches('\0')
            ),
        )
    })?;
    let mut links = Vec::new();
    for dev in devices {
        let name = std::ffi::CString::new(dev.as_str())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad device name"))?;
        // SAFETY: `name` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {dev}"),
            ));
        }
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        attr[8..12].copy_from_slice(&BPF_XDP.to_ne_bytes());
        let link = bpf(BPF_LINK_CREATE, &mut attr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("attaching the loss program to {dev}: {e}"),
            )
        })?;
        links.push(link);
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threshold_gives_the_requested_drop_probability() {
        assert_eq!(threshold(0.5), u32::MAX / 2);
        assert_eq!(threshold(0.01), 42_949_672); // round(0.01 × 2^32) − 1
        assert_eq!(threshold(1e-12), 0);
        // Drop when r0 <= T: (T + 1) / 2^32 values out of 2^32.
        let p = (threshold(0.001) as f64 + 1.0) / 4_294_967_296.0;
        assert!((p - 0.001).abs() < 1e-9);
    }

    #[test]
    fn program_is_six_instructions_ending_in_exit() {
        let code = program(0.01);
        assert_eq!(code.len(), 48);
        assert_eq!(code[40], 0x95);
        assert_eq!(i16::from_ne_bytes([code[10], code[11]]), 2);
    }
}
