//! Configuration as users write it: YAML read with the line and column of every key and
//! item, typed decoding with errors that name file, line and field, the one split of a
//! mapping into common keys and a kind's own, the templates that render a task's fields, and
//! the settings of where images are pulled from.

pub mod decode;
pub mod images;
pub mod kind_keys;
pub mod template;
pub mod yaml;
