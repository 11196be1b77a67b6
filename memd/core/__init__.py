"""Pure core: values in, values out. No filesystem, clock, network or env."""
