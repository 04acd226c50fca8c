// SKELETON: raw serde layer — to be completed by the config helper.
