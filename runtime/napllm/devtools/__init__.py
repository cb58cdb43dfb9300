"""Tools for napplet developers that run under CPython only (never in the page).

`napllm.devtools.check` is the `napllm-check` command (docs/napplets.md):
it needs Playwright and a Chromium, installed with the package's `test`
extra, and is imported by nothing in the runtime. `napllm.devtools.headless`
serves dist/ with the shell's headers and names Chromium and its flags, for
napllm-check, build.py, the browser tests and the benchmarks.
"""
