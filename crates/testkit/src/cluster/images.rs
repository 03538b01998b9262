//! Container images as host binaries: the table a test gives the kubelet.

use std::collections::HashMap;
use std::path::PathBuf;

/// What an image holds: its entrypoint, and the commands a container's `command[0]`
/// may name (e.g. `/usr/lib/linkerd/linkerd2-proxy` mapped to a built binary).
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    /// What runs when the container has no `command` (with the container's `args`).
    pub entrypoint: PathBuf,
    /// `command[0]` as the spec names it, to the host binary that runs.
    pub commands: HashMap<String, PathBuf>,
}

impl ImageSpec {
    /// An image whose entrypoint is this binary.
    pub fn entrypoint(path: impl Into<PathBuf>) -> ImageSpec {
        ImageSpec {
            entrypoint: path.into(),
            commands: HashMap::new(),
        }
    }

    /// Adds a command the image provides.
    pub fn command(mut self, name: &str, path: impl Into<PathBuf>) -> ImageSpec {
        self.commands.insert(name.to_string(), path.into());
        self
    }
}

/// Image reference (exactly as a container's `image` says it) to [`ImageSpec`].
/// A container whose image is not here waits with reason `ImageNotKnown`.
#[derive(Debug, Clone, Default)]
pub struct Images {
    images: HashMap<String, ImageSpec>,
}

impl Images {
    pub fn new() -> Images {
        Images::default()
    }

    /// Adds (or replaces) an image.
    pub fn with(mut self, reference: &str, spec: ImageSpec) -> Images {
        self.images.insert(reference.to_string(), spec);
        self
    }

    pub fn get(&self, reference: &str) -> Option<&ImageSpec> {
        self.images.get(reference)
    }

    /// The argv a container runs: its `command` (the first word looked up in the
    /// image, else taken as is if absolute) or the image's entrypoint, then `args`.
    /// On failure, the waiting reason and message for the container's status.
    pub(crate) fn argv(
        &self,
        image: &str,
        command: &[String],
        args: &[String],
    ) -> Result<Vec<String>, (&'static str, String)> {
        let Some(spec) = self.get(image) else {
            return Err((
                "ImageNotKnown",
                format!("image {image:?} is not in the kubelet's image table"),
            ));
        };
        let mut argv = Vec::with_capacity(command.len() + args.len() + 1);
        match command.split_first() {
            Some((first, rest)) => {
                let path = match spec.commands.get(first) {
                    Some(p) => p.to_string_lossy().into_owned(),
                    None if first.starts_with('/') => first.clone(),
                    None => {
                        return Err((
                            "RunContainerError",
                            format!("image {image:?} has no command {first:?}"),
                        ))
                    }
                };
                argv.push(path);
                argv.extend(rest.iter().cloned());
            }
            None => argv.push(spec.entrypoint.to_string_lossy().into_owned()),
        }
        argv.extend(args.iter().cloned());
        Ok(argv)
    }
}
