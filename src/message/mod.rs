//! Ground floor: the structure of a message as bytes, before any parse
//! into a tree: its header section ([`headers`]), the idempotency key
//! header in it ([`key_header`]: read at acceptance, rewritten at
//! delivery), and the MIME limits that must hold before mail-parser may see
//! it ([`mime_limits`]). Imports no
//! crate module outside this folder.

pub mod headers;
pub mod key_header;
pub mod mime_limits;
