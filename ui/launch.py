"""`python -m kvscope.ui.launch run ui/app.py [streamlit flags]`: Streamlit's own command line,
started after a background thread has begun reading the source named by `KVSCOPE_UI_*`.

Reading and diagnosing a source takes seconds (a recording's replay; a fleet's TSDB queries);
doing it while Streamlit starts and the browser connects means the first page view finds it done
or under way (`ui/data.py` start_preload / take_preloaded; the page's cache then holds it). A live
source's read covers the window ending at launch, and a first view more than a minute later
reads the window ending then instead. The pages' modules are imported meanwhile (and
Streamlit's emoji pattern compiled).
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys


def _import_pages() -> None:
    """Import the UI's modules (pandas, Altair, the diagnoser's renderers: about a second) while
    the preload reads, rather than in the first view's script run; not app.py, the script itself."""
    import kvscope.ui

    for module in pkgutil.iter_modules(kvscope.ui.__path__):
        if module.name not in ("app", "launch"):
            importlib.import_module(f"kvscope.ui.{module.name}")
    # st.warning (every card's first lever) looks for a leading emoji with a regular expression of
    # every emoji, compiled when its module is first imported: 0.2 s of the first view otherwise
    with contextlib.suppress(ImportError):
        importlib.import_module("streamlit.emojis")


def main() -> None:
    from kvscope.ui.data import source_from_env, start_preload

    start_preload(source_from_env())
    _import_pages()  # not on a thread: two threads importing one cycle of modules can deadlock
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
