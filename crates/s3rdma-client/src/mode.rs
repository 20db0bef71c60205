//! Which RDMA mode a mount runs with: the cuObject provider and device found, and the endpoint.

use crate::RdmaMode;

/// Whether `url`'s host is a loopback address (or "localhost").
pub fn is_loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The RDMA mode this mount really runs with, or why `rdma=required` cannot be honoured.
/// `auto` turns into `off` when no usable provider/device exists, or when the loopback provider
/// would talk to an endpoint that is not on this host (its tokens mean nothing there).
/// The client is constructed only on a host with an RDMA port up, and waited for at most
/// `init_timeout` (see `cuobj_ffi::client_within`): a mount never hangs on it.
pub fn resolve_mode(
    requested: RdmaMode,
    endpoint_url: Option<&str>,
    init_timeout: std::time::Duration,
) -> Result<RdmaMode, String> {
    if requested == RdmaMode::Off {
        return Ok(RdmaMode::Off);
    }
    let problem = match cuobj_ffi::client_within(init_timeout) {
        Err(e) => Some(e.to_string()),
        Ok(c) if !c.is_connected() => Some("cuObject found no usable RDMA device (check rdma_dev_addr_list in the file CUFILE_ENV_PATH_JSON names)".to_string()),
        Ok(_) => match cuobj_ffi::provider() {
            cuobj_ffi::Provider::Loopback if !endpoint_url.is_some_and(is_loopback_url) => Some(
                "this build has the loopback cuObject provider (no NVIDIA SDK), which only works with s3rdma-endpoint on this host; build with the SDK (see README) for real RDMA".to_string(),
            ),
            _ => None,
        },
    };
    match (problem, requested) {
        (None, mode) => Ok(mode),
        (Some(why), RdmaMode::Required) => Err(format!(
            "rdma=required cannot be honoured: {why}; use rdma=auto or rdma=off"
        )),
        (Some(why), _) => {
            tracing::info!(reason = %why, "RDMA off for this mount");
            Ok(RdmaMode::Off)
        }
    }
}

/// `s3rdma --version`: the version, the cuObject provider built in and the library loaded, and
/// whether a usable RDMA device was found (within `cuobj_ffi::DEFAULT_DEADLINE`, never a hang).
pub fn version_report(version: &str) -> String {
    let provider = cuobj_ffi::provider();
    let library = match (provider, cuobj_ffi::library()) {
        (cuobj_ffi::Provider::Loopback, _) => "built in (loopback provider)".to_string(),
        (_, Some((path, v))) => format!("libcuobjclient {v} ({})", path.display()),
        (_, None) => "libcuobjclient (version unknown: not found in /proc/self/maps)".to_string(),
    };
    let device = match cuobj_ffi::client() {
        Ok(c) if c.is_connected() => match provider {
            cuobj_ffi::Provider::Nvidia => match cuobj_ffi::rdma_device() {
                Ok(d) => format!("usable ({d})"),
                Err(_) => "usable".to_string(),
            },
            cuobj_ffi::Provider::Loopback => {
                "loopback (talks only to s3rdma-endpoint on this host)".to_string()
            }
        },
        Ok(_) => {
            "no usable RDMA device (check rdma_dev_addr_list in CUFILE_ENV_PATH_JSON)".to_string()
        }
        Err(e) => format!("none: {e}"),
    };
    format!(
        "s3rdma {}\ncuObject provider: {provider}\ncuObject library: {library}\nRDMA device: {device}\nmax registration: {} bytes\n",
        version,
        cuobj_ffi::max_registration_size()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_urls() {
        for u in [
            "http://127.0.0.1:9000",
            "http://127.5.0.1",
            "http://localhost:80/x",
            "http://[::1]:9000",
            "https://[::1]",
        ] {
            assert!(is_loopback_url(u), "{u}");
        }
        for u in [
            "http://10.0.0.1:9000",
            "https://s3.amazonaws.com",
            "http://[2001:db8::1]:80",
            "http://localhost.example.com",
        ] {
            assert!(!is_loopback_url(u), "{u}");
        }
    }

    const T: std::time::Duration = cuobj_ffi::DEFAULT_DEADLINE;

    // [S-RDMA-MODE]
    #[test]
    fn modes() {
        assert_eq!(resolve_mode(RdmaMode::Off, None, T), Ok(RdmaMode::Off));
        if cuobj_ffi::provider() == cuobj_ffi::Provider::Loopback {
            assert_eq!(
                resolve_mode(RdmaMode::Auto, Some("https://s3.amazonaws.com"), T),
                Ok(RdmaMode::Off)
            );
            assert!(resolve_mode(RdmaMode::Required, None, T)
                .unwrap_err()
                .contains("loopback"));
            assert_eq!(
                resolve_mode(RdmaMode::Required, Some("http://127.0.0.1:1"), T),
                Ok(RdmaMode::Required)
            );
        }
    }
}
