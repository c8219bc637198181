"""Cloud targets: how the gateway reaches a function, signed, in upstream or invoke mode."""
