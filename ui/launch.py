"""`python -m kvscope.ui.launch run ui/app.py [streamlit flags]`: Streamlit's own command line,
started after a background thread has begun reading the recording named by `KVSCOPE_UI_*`.

Replaying and diagnosing a recording takes seconds; doing it while Streamlit starts and the
browser connects means the first page view finds it done (`ui/data.py` start_preload /
take_preloaded; the page's cache then holds it). Live sources are read when a page asks.
"""

from __future__ import annotations

import sys


def main() -> None:
    from kvscope.ui.data import source_from_env, start_preload

    start_preload(source_from_env())
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
