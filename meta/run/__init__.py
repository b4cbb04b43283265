"""Where a recipe becomes a run: the recipe and its ``KEY=VALUE`` overrides, the runner that
composes the components it names, the run folder, preflight checks, the error boundary, the
launcher and the replay of asynchronous runs."""
