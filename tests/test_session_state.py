"""A session's state stays the size of the page however many requests it sends (issue 36's soak):
Gradio 6.31 stored every property-updated output a second time under a new id, for good
(tabs/session_state.py)."""
import pytest

from apphelpers import running_app


@pytest.mark.slow
def test_a_sessions_state_holds_one_component_per_page_component_after_many_runs(engine):
    import app
    from gradio_client import Client

    demo = app.build_app(engine)
    with running_app(engine, demo) as url:
        client = Client(url, verbose=False)
        state = None
        for i in range(4):
            client.predict(prompt=f"a photo of a worker number {i}", n=4, api_name="/single_prompt")
            client.predict(search="", api_name="/runs_list")
            state = demo.state_holder.session_data[client.session_hash]
            # the outputs were updated (their configs hold this run's values) ...
            assert any(f"worker number {i}" in str(config) for config in state.config_values.values())
            # ... in place: no component of the session is one the page does not have
            assert set(state.blocks_config.blocks) == set(demo.default_config.blocks), i
            assert set(state.config_values) <= set(demo.default_config.blocks), i


def test_stray_copies_are_dropped_and_rendered_blocks_kept():
    import gradio as gr
    from gradio.state_holder import SessionState

    from tabs.session_state import drop_stray_copies

    with gr.Blocks() as demo:
        shown = gr.HTML("a")
    state = SessionState(demo)
    replacement = gr.HTML("b", render=False)            # what a property update stores under shown's key
    state[shown._id] = replacement
    state[replacement._id] = replacement                 # Gradio's second copy under the new id
    with gr.Blocks():
        dynamic = gr.HTML("c")                          # rendered, as a gr.render block is
    state[dynamic._id] = dynamic
    assert drop_stray_copies(state, demo.default_config.blocks) == 1
    assert state.blocks_config.blocks[shown._id] is replacement
    assert replacement._id not in state.blocks_config.blocks and replacement._id not in state.config_values
    assert dynamic._id in state.blocks_config.blocks
