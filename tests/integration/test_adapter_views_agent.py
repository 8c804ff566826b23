"""The UI's adapter table read from the real agent API (`kvscope ui --agent`) equals the one read
from the recording: the tap's adapter_* series reach a live page beside the rules' signals."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pandas as pd

from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.ui import data as ui_data

RECORDING = Path(__file__).resolve().parent.parent / "recordings" / "lora-two-adapters.om.gz"


def test_the_ui_reads_the_adapter_table_from_the_agent_as_from_the_recording():
    from agentharness import running_agent

    replay = replay_recording(RECORDING)
    store = SqliteStore(MEMORY, background=False)
    store.write(list(replay.samples))
    store.flush()
    start, end = float(np.ceil(replay.start)), float(np.floor(replay.end))

    async def run():
        async with running_agent({"targets": []}, store=store, collectors=[]) as (_, url):
            spec = ui_data.SourceSpec("agent", url, end - start, end)
            return await asyncio.to_thread(ui_data.load_triage, spec, 2.0)

    live = ui_data.group_table(asyncio.run(run()).frame, "adapter").set_index("adapter")
    rec = ui_data.group_table(ui_data.load_triage(ui_data.SourceSpec("recording", str(RECORDING))).frame, "adapter")
    rec = rec.set_index("adapter")
    assert set(live.index) == set(rec.index) == {"a", "b", "tiny-llama"}
    assert list(live.columns) == list(rec.columns)
    # the two grids differ by their ends (the agent's window is whole seconds), so rates differ a little
    pd.testing.assert_frame_equal(live.sort_index(), rec.sort_index(), rtol=0.1)
