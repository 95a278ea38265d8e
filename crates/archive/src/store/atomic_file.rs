//! Durable, atomic file replacement: the one implementation behind the local store's objects
//! and manifests and the archive source's state file (C3).
//!
//! Readers see the old content or the new one, never a partial file, and a crash leaves at
//! most a temp file (`.tmp-…`, which the local store's listing skips): write a temp file in the
//! target's directory, fsync it, rename it over the target, fsync the directory so the rename
//! itself survives power loss.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The prefix of every temp file (listings skip names starting with it).
pub const TEMP_PREFIX: &str = ".tmp-";

/// A fresh temp file name next to `target`.
pub fn temp_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let suffix: u64 = rand::random();
    target.with_file_name(format!("{TEMP_PREFIX}{name}-{suffix:016x}"))
}

/// The directory holding `target` (`.` for a bare file name).
fn dir_of(target: &Path) -> &Path {
    match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Creates the temp file for `target` (its directory created when missing).
pub fn create_temp(target: &Path) -> std::io::Result<(File, PathBuf)> {
    fs::create_dir_all(dir_of(target))?;
    let tmp = temp_path(target);
    let file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    Ok((file, tmp))
}

/// Makes a fully written temp file the target: fsync, rename, directory fsync. The caller
/// removes `tmp` when this fails.
pub fn commit(file: File, tmp: &Path, target: &Path) -> std::io::Result<()> {
    file.sync_all()?;
    drop(file);
    fs::rename(tmp, target)?;
    File::open(dir_of(target))?.sync_all()
}

/// Replaces `target` with `bytes` atomically and durably; on failure nothing is left behind
/// and the old content stays.
pub fn write(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (mut file, tmp) = create_temp(target)?;
    let result = file
        .write_all(bytes)
        .and_then(|()| commit(file, &tmp, target));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b/state.pos");
        write(&target, b"0/1").unwrap();
        write(&target, b"0/16B3748").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"0/16B3748");
        let names: Vec<String> = fs::read_dir(target.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["state.pos".to_string()]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_content_and_removes_the_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a non-empty directory: the rename fails after the temp file exists.
        let target = dir.path().join("occupied");
        fs::create_dir_all(target.join("inside")).unwrap();
        assert!(write(&target, b"x").is_err());
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, vec!["occupied".to_string()], "a temp file was left");
        assert!(target.join("inside").is_dir());
    }
}
