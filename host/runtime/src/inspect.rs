//! Reading a plugin's bytes before compiling them: is it a component, and which `timeout:policy`
//! version does it say it was built against.
//!
//! The guest SDK stamps its API version into the component as a custom section named
//! [`API_VERSION_SECTION`] whose content is the version in UTF-8 (e.g. `0.1.0`). A component
//! nests its core modules, and the stamp sits in whichever core module the SDK was linked
//! into, so the whole component is walked (with `wasmparser`, without validating or compiling).
//! A plugin built without the SDK carries no stamp; the host then falls back to the version of
//! the `timeout:policy/...@X` interfaces it imports, read after compilation.

use wasmparser::{ComponentTypeRef, Encoding, Parser, Payload};

use crate::error::LoadError;

/// Name of the custom section the guest SDK stamps its API version into.
pub const API_VERSION_SECTION: &str = "timeout:policy-api";

/// Longest stamp content read, bytes (a version string; anything longer is malformed).
const MAX_STAMP_BYTES: usize = 64;

/// What a plugin file is, read without compiling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The version in the [`API_VERSION_SECTION`] stamp, if the component carries one.
    pub stamped_api_version: Option<String>,
    /// Core modules nested in the component (at any depth).
    pub core_modules: usize,
    /// What the component imports, by name (`timeout:policy/host@0.1.0`, `wasi:cli/stdin@0.2.6`),
    /// in file order: its own instance and function imports, not its type imports nor those of
    /// components nested in it. A fresh instance sets up every imported function; a Rust plugin
    /// built with `std` imports two dozen WASI interfaces it never calls (the SDKs' "Without
    /// `std`").
    pub imports: Vec<String>,
    /// Size of the file, bytes.
    pub size_bytes: usize,
}

/// Reads `bytes` as a WebAssembly component without compiling it.
///
/// # Errors
/// - [`LoadError::NotAComponent`]: no wasm magic number, or a core module (`detail` says which);
/// - [`LoadError::Malformed`]: the binary cannot be parsed (truncated, corrupt), with the byte
///   offset, or it carries conflicting or unreadable API-version stamps.
pub fn inspect(plugin: &str, bytes: &[u8]) -> Result<Inspection, LoadError> {
    if bytes.len() < 8 || bytes[..4] != *b"\0asm" {
        return Err(LoadError::NotAComponent {
            plugin: plugin.to_string(),
            detail: "no WebAssembly magic number".into(),
        });
    }
    let malformed = |offset: usize, reason: String| LoadError::Malformed {
        plugin: plugin.to_string(),
        offset,
        reason,
    };
    let mut stamps: Vec<String> = Vec::new();
    let mut core_modules = 0;
    let mut imports = Vec::new();
    // Nesting depth: 1 inside the outermost component (each `Version` opens a module or
    // component, each `End` closes one).
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| malformed(e.offset(), e.message().to_string()))?;
        match &payload {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } if depth == 1 => {
                return Err(LoadError::NotAComponent {
                    plugin: plugin.to_string(),
                    detail: "a core module".into(),
                });
            }
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } => core_modules += 1,
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    let import =
                        import.map_err(|e| malformed(e.offset(), e.message().to_string()))?;
                    // Type imports (`order`, `context`: the world's own type names) set
                    // nothing up at instantiation.
                    if !matches!(import.ty, ComponentTypeRef::Type(_)) {
                        imports.push(import.name.name.to_string());
                    }
                }
            }
            Payload::CustomSection(section) if section.name() == API_VERSION_SECTION => {
                let data = section.data();
                let version = std::str::from_utf8(data)
                    .ok()
                    .filter(|_| data.len() <= MAX_STAMP_BYTES)
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        malformed(
                            section.data_offset(),
                            format!(
                                "the `{API_VERSION_SECTION}` section is not a version string \
                                 ({} bytes)",
                                data.len()
                            ),
                        )
                    })?;
                if !stamps.iter().any(|s| s == version) {
                    stamps.push(version.to_string());
                }
            }
            _ => {}
        }
    }
    if stamps.len() > 1 {
        return Err(malformed(
            0,
            format!(
                "conflicting `{API_VERSION_SECTION}` stamps: {}",
                stamps.join(", ")
            ),
        ));
    }
    Ok(Inspection {
        stamped_api_version: stamps.pop(),
        core_modules,
        imports,
        size_bytes: bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component holding one core module with `sections` as custom sections.
    fn component(sections: &[(&str, &[u8])]) -> Vec<u8> {
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        for (name, data) in sections {
            let mut body = vec![name.len() as u8];
            body.extend_from_slice(name.as_bytes());
            body.extend_from_slice(data);
            module.push(0); // custom section id
            module.push(body.len() as u8);
            module.extend(body);
        }
        let mut out = b"\0asm\x0d\0\x01\0".to_vec();
        out.push(1); // component core-module section id
        out.push(module.len() as u8);
        out.extend(module);
        out
    }

    #[test]
    fn a_stamp_in_a_nested_core_module_is_found() {
        let found = inspect("p", &component(&[(API_VERSION_SECTION, b"0.2.0")])).unwrap();
        assert_eq!(found.stamped_api_version.as_deref(), Some("0.2.0"));
        assert_eq!(found.core_modules, 1);
    }

    #[test]
    fn an_unstamped_component_has_no_version() {
        let found = inspect("p", &component(&[("other", b"x")])).unwrap();
        assert_eq!(found.stamped_api_version, None);
    }

    #[test]
    fn conflicting_stamps_are_malformed() {
        let bytes = component(&[
            (API_VERSION_SECTION, b"0.1.0"),
            (API_VERSION_SECTION, b"0.2.0"),
        ]);
        let err = inspect("p", &bytes).unwrap_err();
        assert!(
            matches!(&err, LoadError::Malformed { reason, .. } if reason.contains("0.1.0, 0.2.0")),
            "{err}"
        );
    }

    #[test]
    fn a_truncated_component_is_malformed_with_its_offset() {
        let bytes = component(&[(API_VERSION_SECTION, b"0.1.0")]);
        let err = inspect("p", &bytes[..bytes.len() - 3]).unwrap_err();
        assert!(
            matches!(err, LoadError::Malformed { offset, .. } if offset > 0),
            "{err}"
        );
    }
}
