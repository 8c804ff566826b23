"""The rule and lever catalog: what kvscope can diagnose and which knobs it recommends."""

from __future__ import annotations

import pandas as pd
import streamlit as st


def render() -> None:
    from kvscope.diagnoser.actions import KIND_LABEL, change_text
    from kvscope.diagnoser.citations import cite_all
    from kvscope.diagnoser.rulebook.levers import load_levers
    from kvscope.diagnoser.rulebook.rule import read_rules

    st.title("Rules & levers")
    rules = read_rules()
    st.header(f"Diagnosis rules ({len(rules)})")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "rule": r.id,
                    "title": r.title,
                    "severity": r.severity,
                    "by": ", ".join(r.by),
                    "citations": "; ".join(c.text for c in cite_all(r.tree.meta.get("citations") or ())),
                }
                for r in rules
            ]
        ),
        hide_index=True,
        width="stretch",
    )
    levers = load_levers()
    st.header(f"Levers ({len(levers)})")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "lever": lv.id,
                    "title": lv.title,
                    "kind": KIND_LABEL[lv.kind],
                    "changes": lv.changes,
                    "cost": lv.cost,
                    "how": "\n".join(change_text(c) for c in lv.how),
                    "citations": "; ".join(lv.citations),
                }
                for lv in levers.values()
            ]
        ),
        hide_index=True,
        width="stretch",
    )
