//! The congestion-control registry: which algorithms hsxfer can select on this host, and a
//! clear refusal (with what to run) for one it cannot.

use crate::transport::cc::CcCatalog;
use crate::tuning::bundled;

/// Checks that `name` can be selected here; otherwise says what is available and how to get
/// it. `host` names the machine in the message ("client", "server").
pub fn check_usable(
    cat: &CcCatalog,
    name: &str,
    privileged: bool,
    host: &str,
) -> Result<(), String> {
    if cat.usable(name, privileged) {
        return Ok(());
    }
    let available = cat.available.join(" ");
    if cat.available.iter().any(|a| a == name) {
        let mut allowed = cat.allowed.clone();
        allowed.push(name.to_string());
        return Err(format!(
            "congestion control '{name}' is registered on the {host} but only root may select it; \
             run as root, or allow it for everyone: sysctl -w net.ipv4.tcp_allowed_congestion_control=\"{}\"",
            allowed.join(" ")
        ));
    }
    let hint = if bundled::find(name).is_some() {
        format!("; hsxfer bundles it: run `sudo hsxfer cc load {name} --pin` on the {host}")
    } else {
        String::new()
    };
    Err(format!(
        "congestion control '{name}' is not available on the {host}; available: {available}{hint}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> CcCatalog {
        CcCatalog {
            available: vec!["reno".into(), "bbr".into(), "cubic".into()],
            allowed: vec!["reno".into(), "bbr".into()],
            default: "bbr".into(),
        }
    }

    #[test]
    fn refusals_name_the_fix() {
        let c = catalog();
        assert_eq!(check_usable(&c, "reno", false, "client"), Ok(()));
        assert_eq!(check_usable(&c, "cubic", true, "client"), Ok(()));
        let e = check_usable(&c, "cubic", false, "server").unwrap_err();
        assert!(
            e.contains("tcp_allowed_congestion_control=\"reno bbr cubic\""),
            "{e}"
        );
        let e = check_usable(&c, "htcp", true, "client").unwrap_err();
        assert_eq!(
            e,
            "congestion control 'htcp' is not available on the client; available: reno bbr cubic; \
             hsxfer bundles it: run `sudo hsxfer cc load htcp --pin` on the client"
        );
        let e = check_usable(&c, "vegas", true, "client").unwrap_err();
        assert!(e.ends_with("available: reno bbr cubic"), "{e}");
    }
}
