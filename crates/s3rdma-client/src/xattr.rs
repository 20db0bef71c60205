//! User extended attributes stored with the object in s3fs's layout (its `-o use_xattr`), so
//! each tool reads the other's: one header, `x-amz-meta-xattr`, holding
//! `urlencode({"name":"base64(value)",...})` — names sorted and unescaped, values in standard
//! padded base64, and every byte outside `A-Z a-z 0-9 . - _ ~ /` percent-encoded with upper
//! case hex. No attributes: no header. Reading is as lenient as s3fs's: the text between the
//! first `{` and the last `}`, split at `,`, each pair split at its last `:`.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// The user metadata name (without `x-amz-meta-`).
pub const HEADER: &str = "xattr";

/// Extended attributes by name (`user.origin` → its bytes).
pub type Xattrs = BTreeMap<String, Vec<u8>>;

/// Whether s3fs's layout can hold an attribute of this name: not empty, and no `"`, `,` or
/// NUL, which its unescaped JSON cannot carry.
pub fn storable_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['"', ',', '\0'])
}

/// The header's value for `attrs` (`None` when there are none: the header is left out).
pub fn encode(attrs: &Xattrs) -> Option<String> {
    if attrs.is_empty() {
        return None;
    }
    let mut json = String::from("{");
    for (i, (name, value)) in attrs.iter().enumerate() {
        if i > 0 {
            json.push(',');
        }
        json.push('"');
        json.push_str(name);
        json.push_str("\":\"");
        json.push_str(&STANDARD.encode(value));
        json.push('"');
    }
    json.push('}');
    Some(url_encode(&json))
}

/// The attributes in a header's value; pairs that do not parse are skipped.
pub fn decode(header: &str) -> Xattrs {
    let text = url_decode(header);
    let mut out = Xattrs::new();
    let (Some(open), Some(close)) = (text.find('{'), text.rfind('}')) else {
        return out;
    };
    if close <= open {
        return out;
    }
    for pair in text[open + 1..close].split(',') {
        let Some((name, value)) = pair.rsplit_once(':') else {
            continue;
        };
        let name = name.trim().trim_matches('"');
        let value = value.trim().trim_matches('"');
        if name.is_empty() {
            continue;
        }
        if let Ok(bytes) = STANDARD.decode(value) {
            out.insert(name.to_string(), bytes);
        }
    }
    out
}

fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b".-_~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3fs_layout_both_ways() {
        let mut a = Xattrs::new();
        a.insert("user.a".into(), b"hello".to_vec());
        a.insert("user.b".into(), Vec::new());
        let h = encode(&a).expect("a header");
        // The exact text s3fs writes for these two.
        assert_eq!(
            h,
            "%7B%22user.a%22%3A%22aGVsbG8%3D%22%2C%22user.b%22%3A%22%22%7D"
        );
        assert_eq!(decode(&h), a);
        // What s3fs's own test seeds; lower case hex reads too.
        let seeded = decode("%7B%22key%22%3A%22dmFsdWU%3D%22%7D");
        assert_eq!(seeded.get("key").map(|v| v.as_slice()), Some(&b"value"[..]));
        assert_eq!(decode("%7b%22k%22%3a%22dg%3d%3d%22%7d")["k"], b"v");
        assert!(encode(&Xattrs::new()).is_none());
        // Names with ':' and non-ASCII names survive; a bad pair is skipped.
        let mut c = Xattrs::new();
        c.insert("user.x:y".into(), vec![0, 255, 1]);
        c.insert("user.ünï".into(), b"/+=".to_vec());
        assert_eq!(decode(&encode(&c).expect("header")), c);
        assert_eq!(
            decode("%7B%22bad%22%2C%22k%22%3A%22dg%3D%3D%22%7D").len(),
            1
        );
        assert!(decode("garbage %ZZ %").is_empty());
        assert!(!storable_name("user.a,b") && !storable_name("") && storable_name("user.a"));
    }
}
