"""A data scientist's path in a real browser: the spawn form, a refusal on the form, a GPU server."""

from .conftest import browser_log_in, pod_of, server_state, stop_server, wait_for


def test_form_refusal_is_shown_on_the_form_and_a_valid_choice_starts(browser, hub, kube):
    page = browser_log_in(browser, hub, "dora", "/hub/spawn")
    assert page.locator("#profile-item-pytorch").count() == 1 or "PyTorch" in page.content()
    counts = "select[name='profile-option-pytorch--gpus']"
    # the form offers only what dora (default limit: 2) may take
    offered = page.eval_on_selector_all(f"{counts} option", "options => options.map(o => o.value)")
    assert offered == ["0", "1", "2"]
    # a stale or tampered form asking for 4 A100 is refused on the server, shown on the form
    page.check("input[name=profile][value=pytorch]")
    page.select_option("select[name='profile-option-pytorch--gpu_type']", "a100")
    page.eval_on_selector(counts, "s => { s.add(new Option('4 GPUs', '4')); s.value = '4'; }")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_load_state()
    text = page.inner_text("body")
    assert "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer." in text
    assert "Traceback" not in text and "KeyError" not in text
    assert server_state(hub, "dora") is None
    assert pod_of(kube, "dora") is None

    # 2 A100 fits: the spawn goes through the progress page to the notebook
    page.check("input[name=profile][value=pytorch]")
    page.select_option("select[name='profile-option-pytorch--gpu_type']", "a100")
    page.select_option("select[name='profile-option-pytorch--gpus']", "2")
    page.click("input[type=submit], button[type=submit]")
    try:
        # the progress page sends the browser on to the notebook once it is ready
        page.wait_for_url("**/user/dora/**", wait_until="commit", timeout=120_000)
        wait_for(lambda: (server_state(hub, "dora") or {}).get("ready"), 60, what="dora's server")
        pod = pod_of(kube, "dora")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    finally:
        stop_server(hub, "dora")
