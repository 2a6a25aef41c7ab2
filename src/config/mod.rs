//! Configuration as users write it: YAML read with the line and column of every key and
//! item, typed decoding with errors that name file, line and field, and the templates
//! that render a task's fields.

pub mod decode;
pub mod template;
pub mod yaml;
