"""The ranks' side, in both modes: a worker joins its group once, then runs the tests it is sent."""
