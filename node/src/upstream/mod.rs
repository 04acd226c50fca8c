//! HTTP/1.1 client for upstream providers.
// SKELETON — to be completed by the adapter helper.
