//! rt placeholder
