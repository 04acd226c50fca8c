// SKELETON: ${VAR} expansion — to be completed by the config helper.
