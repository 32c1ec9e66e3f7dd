"""Screenshots of the chat page (README): desktop and phone width, light and dark, from one live conversation.

    PYTHONPATH=. .venv/bin/python scripts/web_screenshots.py            # docs/web-*.png
    PYTHONPATH=. .venv/bin/python scripts/web_screenshots.py --pair demo --out /tmp/shots

It starts ``localflash serve --pair demo -t 1 --fixed --draft-max 4`` (a fixed draft length, so the
drafter drafts on a CPU too), sends the prompts through the page's own message
box, then photographs the same page at each size and colour scheme.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright

from localflash.testing.browser import launch, missing
from localflash.testing.serve import LiveServer

PROMPTS = ["Write a short Python function that checks whether a number is prime.", "What does the loop in it do? Answer in two sentences."]
SHOTS = [("desktop", {"width": 1280, "height": 860}), ("phone", {"width": 390, "height": 844})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo")
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--threads", default="1")
    ap.add_argument("--max-tokens", type=int, default=120)
    args = ap.parse_args()
    if (why := missing()) is not None:
        raise SystemExit(why)
    args.out.mkdir(parents=True, exist_ok=True)
    server = LiveServer("--pair", args.pair, "-t", args.threads, "--fixed", "--draft-max", "4")
    try:
        with sync_playwright() as p:
            browser = launch(p)
            page = browser.new_page(viewport=SHOTS[0][1])
            page.goto(server.url + "/")
            page.wait_for_function("() => window.localflashPage.state.info !== null")
            page.click("#settings-btn")
            page.fill("#set-max_tokens", str(args.max_tokens))
            page.fill("#set-temperature", "0")
            page.keyboard.press("Enter")
            for n, prompt in enumerate(PROMPTS, 1):
                page.fill("#input", prompt)
                page.keyboard.press("Enter")
                page.wait_for_selector(f".msg.assistant:nth-of-type({2 * n})[data-state=done]", timeout=300_000)
            for name, size in SHOTS:
                page.set_viewport_size(size)
                for scheme in ("light", "dark"):
                    page.emulate_media(color_scheme=scheme)
                    page.evaluate("() => [...document.querySelectorAll('.msg.user')].pop().scrollIntoView({block: 'start'})")
                    page.wait_for_timeout(300)
                    path = args.out / f"web-{name}-{scheme}.png"
                    page.screenshot(path=str(path))
                    print(path, path.stat().st_size // 1024, "KiB")
            browser.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
