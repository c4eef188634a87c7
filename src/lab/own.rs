//! The labs this process is building or running an experiment on, so that a signal that
//! stops it can remove them ([`Lab::remove_claimed`](super::Lab::remove_claimed)): their
//! delay element and server run in process groups of their own, and would outlive it with
//! its namespaces, and the next `lab run` would find the name taken.

use std::sync::Mutex;

static OWN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// This process's hold on a lab's name, from before its first namespace exists until the
/// lab is complete (`lab up`) or removed (an experiment's lab).
#[derive(Debug)]
pub struct Claim(String);

impl Claim {
    /// Claims `name`, whose lab this process is about to build.
    pub fn new(name: &str) -> Claim {
        own().push(name.to_string());
        Claim(name.to_string())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut own = own();
        if let Some(i) = own.iter().position(|n| *n == self.0) {
            own.remove(i);
        }
    }
}

fn own() -> std::sync::MutexGuard<'static, Vec<String>> {
    OWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of every lab this process claimed, given up.
pub fn take_claimed() -> Vec<String> {
    std::mem::take(&mut *own())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_holds_its_name_until_dropped() {
        let held = |name: &str| own().iter().filter(|n| *n == name).count();
        let a = Claim::new("own_t1");
        let b = Claim::new("own_t1");
        assert_eq!(held("own_t1"), 2);
        drop(a);
        assert_eq!(held("own_t1"), 1);
        drop(b);
        assert_eq!(held("own_t1"), 0);
    }
}
