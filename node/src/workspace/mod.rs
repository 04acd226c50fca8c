//! The workspaces this node serves for the edge's single-request
//! coordinator: the catalog the edge delivers, checked against this host
//! before the node says it is ready, and the file operations inside one
//! ([`files`]), the commands run in it ([`command`]) and each request's
//! own directory there ([`jobs`]).

mod catalog;
pub mod command;
pub mod files;
pub mod jobs;

pub use catalog::{admit, Catalog};
