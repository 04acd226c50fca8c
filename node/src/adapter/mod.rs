//! Provider adapters: how the node talks to one provider.
// SKELETON — to be completed by the adapter helper.
