//! The RDMA side of the data plane: the cuObject provider, the reply contract, checksums.

pub mod checksum;
pub mod reply;

/// `s3rdma --version`: the version, the cuObject provider built in, and whether a usable RDMA
/// device was found.
pub fn version_report() -> String {
    let provider = cuobj_ffi::provider();
    let device = match cuobj_ffi::client() {
        Ok(c) if c.is_connected() => match provider {
            cuobj_ffi::Provider::Nvidia => "usable RDMA device found".to_string(),
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
        "s3rdma {}\ncuObject provider: {provider}\nRDMA device: {device}\nmax registration: {} bytes\n",
        crate::cli::VERSION,
        cuobj_ffi::max_registration_size()
    )
}
