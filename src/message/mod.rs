//! Ground floor: the structure of a message as bytes, before any parse
//! into a tree: its header section ([`headers`]) and the MIME limits that
//! must hold before mail-parser may see it ([`mime_limits`]). Imports no
//! crate module outside this folder.

pub mod headers;
pub mod mime_limits;
