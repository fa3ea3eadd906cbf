"""The WGSL kernel files: one per kernel family, specialised only by `override` constants
(the browser page loads the very same text); a `*_subgroups.wgsl` file extends its base
with subgroup operations (runtime/shaders.py joins them)."""
