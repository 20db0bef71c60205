//! Staged files: the write path for everything the streaming path cannot serve — opens for
//! read-write, appends, edits in place, truncation, writes out of order, writable `mmap`.
//! A staged file's bytes live in a local staging file (`area`), shared by every handle of the
//! inode, and are stored as a new version at `fsync` and close, composed on the server from
//! the unchanged ranges of the version it started from (`plan`, `file`).

pub mod area;
pub mod file;
pub mod plan;
pub mod ranges;

pub use area::StagingArea;
pub use file::{StageError, StagedFile, StagedStat};
