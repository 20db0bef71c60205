//! `x-amz-checksum-crc64nvme`: CRC-64/NVME of the payload, big-endian, base64. Sent with every
//! PUT and UploadPart, so that a server that ignores the RDMA token (and sees an empty body)
//! rejects the upload instead of storing a 0-byte object.

use base64::Engine;

pub const HEADER: &str = "x-amz-checksum-crc64nvme";

pub fn crc64nvme(data: &[u8]) -> u64 {
    let mut d = crc64fast_nvme::Digest::new();
    d.write(data);
    d.sum64()
}

/// The header value for `data`.
pub fn crc64nvme_base64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(crc64nvme(data).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_value_and_encoding() {
        // The CRC-64/NVME check value.
        assert_eq!(crc64nvme(b"123456789"), 0xae8b14860a799888);
        assert_eq!(crc64nvme_base64(b"123456789"), "rosUhgp5mIg=");
        assert_eq!(crc64nvme_base64(b""), "AAAAAAAAAAA=");
    }
}
