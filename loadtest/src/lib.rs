//! loadtest
