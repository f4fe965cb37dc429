"""The decision-quality benchmark (`spec-advisor bench`): the real advisor pipeline against the simulated world, in
simulated time, next to static policies and an oracle that knows the world's true physics (docs/bench.md)."""
