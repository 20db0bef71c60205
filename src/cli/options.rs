//! The mount-helper form: `-o name[=value],...` rewritten into the flags it spells, so that
//! clap parses every option once, with one table of names, values and defaults (the flags).
//!
//! `mount -t fuse.s3rdma bucket /mnt -o endpoint_url=...,ro` and `/etc/fstab` hand the daemon
//! its options that way. Each `name` is a flag's long name with `_` for `-`; a boolean takes no
//! value or `=true|false` (and the like: yes/no, on/off, 1/0). The rewritten flags go after the
//! command line's own, in order, and the last word on an option wins (`--uid 5 -o uid=7` is 7;
//! `-o ro,rw` is read-write): a value option is given again, a boolean set to false takes its
//! earlier mentions out. A few names are aliases (`ro`, `rw`, `endpoint`, and `passthrough`,
//! `file_metadata`, `dir_markers` for the negated flags); `exec`/`noexec`, `dev`/`nodev`,
//! `suid`/`nosuid` go to the kernel; the standard options that mean nothing here are ignored.

use std::ffi::OsString;

use clap::ArgAction;
use s3rdma_proto::units::{parse_bool, split_options};

/// Standard mount(8) options that make no sense for this file system and are ignored on purpose.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "_netdev",
    "nofail",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "async",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "nonempty",
];

/// Mount options that go to the kernel as they are (`--kernel-flag`).
pub const KERNEL_FLAGS: &[&str] = &["exec", "noexec", "dev", "nodev", "suid", "nosuid"];

/// Other names for flags: (name, the flag's `-o` name, whether the value is negated).
const ALIASES: &[(&str, &str, bool)] = &[
    ("endpoint", "endpoint_url", false),
    ("ro", "read_only", false),
    ("rw", "read_only", true),
    ("passthrough", "no_passthrough", true),
    ("file_metadata", "no_file_metadata", true),
    ("dir_markers", "no_dir_markers", true),
];

/// `args` (the program's name first) with every `-o` group replaced by the flags it spells,
/// appended after the other arguments (before a `--`, if any); `cmd` is the command whose
/// flags they are.
pub fn expand(args: Vec<OsString>, cmd: &clap::Command) -> Result<Vec<OsString>, String> {
    let mut out = Vec::with_capacity(args.len());
    let mut groups = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--" {
            out.push(a);
            out.extend(it.by_ref());
            break;
        }
        match a.to_str().and_then(|s| s.strip_prefix("-o")) {
            Some("") => groups.extend(it.next()),
            Some(group) => groups.push(group.into()),
            None => out.push(a),
        }
    }
    let end = out.iter().position(|a| a == "--").unwrap_or(out.len());
    let mut flags: Vec<OsString> = out.drain(..end).collect();
    for group in &groups {
        let group = group
            .to_str()
            .ok_or("mount options must be UTF-8 text (-o)")?;
        for opt in split_options(group).iter().filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt.as_str(), None),
            };
            apply(&mut flags, cmd, key, value)?;
        }
    }
    flags.extend(out);
    Ok(flags)
}

/// Add (or, for a boolean set to false, take out) the flag that `-o key[=value]` spells.
fn apply(
    flags: &mut Vec<OsString>,
    cmd: &clap::Command,
    key: &str,
    value: Option<&str>,
) -> Result<(), String> {
    if IGNORED.contains(&key) || key.starts_with("x-") || key == "comment" {
        return Ok(());
    }
    if KERNEL_FLAGS.contains(&key) {
        flags.push(format!("--kernel-flag={key}").into());
        return Ok(());
    }
    let (name, negated) = ALIASES
        .iter()
        .find(|(alias, _, _)| *alias == key)
        .map_or((key, false), |(_, name, neg)| (*name, *neg));
    let arg = (!name.contains('-'))
        .then(|| name.replace('_', "-"))
        .and_then(|long| cmd.get_arguments().find(|a| a.get_long() == Some(&long)))
        .filter(|a| !matches!(a.get_long(), Some("help" | "version" | "kernel-flag")));
    let Some(arg) = arg else {
        return Err(format!(
            "unknown mount option '{key}'; see 's3rdma --help' for the options (any flag works as -o name=value with '_' for '-')"
        ));
    };
    let long = format!("--{}", arg.get_long().unwrap_or_default());
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        let on = value.map_or(Ok(true), parse_bool);
        let on = on.map_err(|e| format!("mount option '{key}': {e}"))? != negated;
        let short = arg.get_short().map(|c| format!("-{c}"));
        flags.retain(|f| *f != *long && short.as_deref().is_none_or(|s| *f != *s));
        if on {
            flags.push(long.into());
        }
        return Ok(());
    }
    let value =
        value.ok_or_else(|| format!("mount option '{key}' needs a value: -o {key}=VALUE"))?;
    flags.push(format!("{long}={value}").into());
    Ok(())
}
