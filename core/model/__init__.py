"""Model KV specs: presets, config.json reading, equation 1 and capacity."""
