//! Mapping container images to local binaries (`--binary NAME=PATH`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// One `--binary NAME=PATH` mapping.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    pub name: String,
    pub path: PathBuf,
}

#[derive(Clone, Debug, Default)]
pub struct ImageMap {
    mappings: Vec<Mapping>,
}

impl ImageMap {
    /// Parses `NAME=PATH` specs. PATH must be absolute (it is executed inside the pod's mount
    /// namespace, with the pod's working directory).
    pub fn parse(specs: &[String]) -> anyhow::Result<Self> {
        let mut mappings = Vec::new();
        for spec in specs {
            let (name, path) = spec
                .split_once('=')
                .with_context(|| format!("--binary {spec:?}: expected NAME=PATH"))?;
            let name = name.trim().trim_matches('/');
            if name.is_empty() {
                bail!("--binary {spec:?}: empty image name");
            }
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                bail!("--binary {spec:?}: PATH must be absolute");
            }
            mappings.push(Mapping {
                name: name.to_string(),
                path,
            });
        }
        Ok(Self { mappings })
    }

    /// The mapping for an image: the image's repository (without registry tag or digest) must
    /// equal NAME or end in `/NAME` (`larch` matches `ghcr.io/x/larch:dev` and `larch`, not
    /// `ghcr.io/x/notlarch`). The first matching `--binary` wins.
    pub fn lookup(&self, image: &str) -> Option<&Mapping> {
        let repo = repository(image);
        self.mappings
            .iter()
            .find(|m| repo == m.name || repo.ends_with(&format!("/{}", m.name)))
    }

    pub fn names(&self) -> Vec<String> {
        self.mappings.iter().map(|m| m.name.clone()).collect()
    }
}

/// `registry:5000/a/b:tag@sha256:...` → `registry:5000/a/b`.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(colon) => &image[..last_slash + colon],
        None => image,
    }
}

/// The program and its arguments for a container, after `$(VAR)` expansion of `command`/`args`:
/// - no `command`: the mapped binary is the entrypoint, `args` are its arguments;
/// - `command[0]` names the mapped binary (equal to NAME, or its file name equal to NAME or to
///   the mapped file's name, e.g. `larch` or `/usr/local/bin/larch`): the mapped binary;
/// - otherwise `command[0]` is a program of this machine (absolute, or looked up in PATH), so a
///   shell-like image can run `sh -c ...`.
pub fn resolve_command(
    mapping: &Mapping,
    command: &[String],
    args: &[String],
) -> (PathBuf, Vec<String>) {
    let Some((first, rest)) = command.split_first() else {
        return (mapping.path.clone(), args.to_vec());
    };
    let base = Path::new(first)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mapped_base = mapping
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name_base = mapping.name.rsplit('/').next().unwrap_or(&mapping.name);
    let program = if *first == mapping.name || base == name_base || base == mapped_base {
        mapping.path.clone()
    } else {
        PathBuf::from(first)
    };
    let mut all = rest.to_vec();
    all.extend(args.iter().cloned());
    (program, all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ImageMap {
        ImageMap::parse(&[
            "larch=/work/target/debug/larch".to_string(),
            "python=/usr/bin/python3".to_string(),
            "sh=/bin/sh".to_string(),
        ])
        .unwrap()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn repository_strips_tag_and_digest() {
        assert_eq!(repository("ghcr.io/x/larch:dev"), "ghcr.io/x/larch");
        assert_eq!(repository("localhost:5000/larch"), "localhost:5000/larch");
        assert_eq!(repository("localhost:5000/larch:1"), "localhost:5000/larch");
        assert_eq!(repository("larch@sha256:abc"), "larch");
        assert_eq!(repository("a/larch:1@sha256:abc"), "a/larch");
        assert_eq!(repository("python"), "python");
    }

    #[test]
    fn lookup_matches_last_path_components() {
        let m = map();
        assert_eq!(
            m.lookup("ghcr.io/x/larch:dev").unwrap().path,
            PathBuf::from("/work/target/debug/larch")
        );
        assert_eq!(m.lookup("larch").unwrap().name, "larch");
        assert_eq!(
            m.lookup("docker.io/library/python:3.12-slim").unwrap().name,
            "python"
        );
        assert!(m.lookup("ghcr.io/x/notlarch:dev").is_none());
        assert!(m.lookup("busybox").is_none());
        assert!(m.lookup("larch-operator:1").is_none());
    }

    #[test]
    fn multi_component_names() {
        let m = ImageMap::parse(&["x/larch=/bin/true".to_string()]).unwrap();
        assert!(m.lookup("ghcr.io/x/larch:dev").is_some());
        assert!(m.lookup("ghcr.io/y/larch:dev").is_none());
    }

    #[test]
    fn parse_rejects_bad_specs() {
        assert!(ImageMap::parse(&["larch".to_string()]).is_err());
        assert!(ImageMap::parse(&["larch=relative/path".to_string()]).is_err());
        assert!(ImageMap::parse(&["=/bin/sh".to_string()]).is_err());
    }

    #[test]
    fn command_resolution() {
        let m = map();
        let larch = m.lookup("ghcr.io/x/larch:dev").unwrap();
        // no command: mapped binary + args
        assert_eq!(
            resolve_command(larch, &[], &s(&["engine", "--listen", "127.1.0.2:8080"])),
            (
                PathBuf::from("/work/target/debug/larch"),
                s(&["engine", "--listen", "127.1.0.2:8080"])
            )
        );
        // command[0] names the binary
        assert_eq!(
            resolve_command(larch, &s(&["larch", "export"]), &s(&["--once"])),
            (
                PathBuf::from("/work/target/debug/larch"),
                s(&["export", "--once"])
            )
        );
        assert_eq!(
            resolve_command(larch, &s(&["/usr/local/bin/larch"]), &s(&["x"])),
            (PathBuf::from("/work/target/debug/larch"), s(&["x"]))
        );
        // another program of this machine
        let py = m.lookup("python:3").unwrap();
        assert_eq!(
            resolve_command(py, &s(&["python3", "-m", "http.server"]), &[]),
            (PathBuf::from("/usr/bin/python3"), s(&["-m", "http.server"]))
        );
        assert_eq!(
            resolve_command(py, &s(&["sh", "-c", "echo hi"]), &[]),
            (PathBuf::from("sh"), s(&["-c", "echo hi"]))
        );
    }
}
