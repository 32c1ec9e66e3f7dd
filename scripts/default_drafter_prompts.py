"""The training prompts of the default DFlash drafter (SmolLM2-135M-Instruct).

GSM8K *train* questions, plus prompts built here from templates, hand-written
German sentences and the Python standard library's own docstrings (code and
documentation prompts). Nothing comes from Spec-Bench or HumanEval. The list
is deterministic for a given Python minor version (docstrings differ a little
between versions); ``python scripts/default_drafter_prompts.py OUT.jsonl``
writes it.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

GSM8K = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k_train.jsonl"
N_GSM8K = 640

TOPICS = [
    "the water cycle", "photosynthesis", "black holes", "the French Revolution", "machine learning", "climate change",
    "the human heart", "volcanoes", "the stock market", "renewable energy", "the Roman Empire", "vaccines",
    "the internet", "honeybees", "the Moon landing", "inflation", "plate tectonics", "DNA", "the printing press",
    "coral reefs", "electric cars", "sleep", "the immune system", "rainbows", "the Great Wall of China",
    "recycling", "earthquakes", "the solar system", "democracy", "coffee", "the Olympic Games", "antibiotics",
    "social media", "the Renaissance", "tides", "gravity", "bread baking", "chess", "the Amazon rainforest",
    "nuclear power", "jazz music", "the Industrial Revolution", "public libraries", "bicycles", "glaciers",
    "time zones", "the periodic table", "compound interest", "urban gardening", "video games",
]
WRITING = [
    "Write a short story about {t}.",
    "Write a blog post introduction about {t}.",
    "Write a short poem about {t}.",
    "Write a persuasive paragraph about why people should learn about {t}.",
    "Write an email to a friend telling them what you learned about {t}.",
    "Write a dialogue between a teacher and a student about {t}.",
]
EXPLAIN = [
    "Explain {t} to a ten-year-old.",
    "What is {t}? Answer in a few sentences.",
    "Give three interesting facts about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize the history of {t} in one paragraph.",
    "List five questions a student might ask about {t}, with short answers.",
]
GERMAN = [
    "Der Zug nach Berlin hat heute zwanzig Minuten Verspätung.",
    "Meine Schwester studiert Medizin an der Universität Heidelberg.",
    "Wir haben am Wochenende einen langen Spaziergang im Wald gemacht.",
    "Die Regierung plant neue Gesetze zum Schutz der Umwelt.",
    "Kannst du mir bitte sagen, wo der nächste Bahnhof ist?",
    "Das Museum ist montags geschlossen, aber dienstags kostenlos.",
    "Nach dem Regen roch die Luft frisch und sauber.",
    "Die Firma hat im letzten Jahr mehr als tausend neue Mitarbeiter eingestellt.",
    "Ich trinke morgens gern einen Kaffee mit etwas Milch.",
    "Der Bürgermeister eröffnete gestern die neue Brücke über den Fluss.",
    "Viele Studenten arbeiten neben dem Studium in Teilzeit.",
    "Im Sommer fahren wir jedes Jahr an die Ostsee.",
    "Das Konzert war ausverkauft, deshalb blieben wir zu Hause.",
    "Die Wissenschaftler haben eine neue Art von Frosch entdeckt.",
    "Bitte schließen Sie die Tür, wenn Sie den Raum verlassen.",
    "Unser Nachbar repariert sein altes Auto in der Garage.",
    "Die Preise für Lebensmittel sind in diesem Jahr stark gestiegen.",
    "Der Lehrer erklärte die Aufgabe noch einmal langsam.",
    "Am Abend saßen wir zusammen und erzählten Geschichten.",
    "Die Ärztin empfahl ihm, mehr Wasser zu trinken und früher zu schlafen.",
    "Das neue Stadion soll im nächsten Frühling fertig werden.",
    "Meine Großeltern wohnen in einem kleinen Dorf in den Alpen.",
    "Der Film basiert auf einem berühmten Roman aus dem neunzehnten Jahrhundert.",
    "Wegen des Streiks fielen viele Flüge aus.",
    "Sie lernt seit drei Jahren Japanisch und möchte bald nach Tokio reisen.",
    "Die Kinder spielten im Garten, bis es dunkel wurde.",
    "Der Bericht zeigt, dass immer mehr Menschen mit dem Fahrrad zur Arbeit fahren.",
    "In der Bibliothek kann man auch Filme und Spiele ausleihen.",
    "Das Restaurant an der Ecke serviert die beste Suppe der Stadt.",
    "Die Polizei bittet die Bevölkerung um Hinweise zu dem Unfall.",
    "Er hat vergessen, seinen Schlüssel mitzunehmen.",
    "Die Ausstellung zeigt Gemälde aus ganz Europa.",
    "Morgen soll es schneien, also zieh dich warm an.",
    "Die Mannschaft gewann das Spiel in der letzten Minute.",
    "Wir müssen das Projekt bis Freitag abschließen.",
    "Der Garten ist voller Blumen, seit meine Mutter ihn pflegt.",
    "Das Unternehmen investiert stark in erneuerbare Energien.",
    "Nach der Operation musste sie zwei Wochen im Krankenhaus bleiben.",
    "Der alte Leuchtturm ist heute ein beliebtes Ausflugsziel.",
    "Ich habe das Buch in einer Nacht gelesen, so spannend war es.",
]
QUESTIONS = [
    "Who invented the telephone?", "What is the capital of Australia?", "How many bones are in the human body?",
    "When did the Second World War end?", "Who wrote Pride and Prejudice?", "What is the largest planet in our solar system?",
    "How far is the Moon from the Earth?", "What language is spoken in Brazil?", "Who painted the Mona Lisa?",
    "What is the boiling point of water at sea level?", "Which ocean is the largest?", "Who was the first person to walk on the Moon?",
    "What does a thermometer measure?", "How many continents are there?", "What is the chemical symbol for gold?",
    "Who discovered penicillin?", "What is the tallest mountain in the world?", "What is the speed of light?",
    "Which country has the largest population?", "Who developed the theory of relativity?", "What year did the Titanic sink?",
    "What is the longest river in Africa?", "How many players are on a soccer team?", "Who composed the Four Seasons?",
    "What is the main ingredient of guacamole?", "What is the smallest prime number?", "Where is the Eiffel Tower?",
    "What gas do plants absorb from the air?", "Who was Cleopatra?", "What is the currency of Japan?",
    "How many days are in a leap year?", "What is the hardest natural substance?", "Who founded Microsoft?",
    "What is the freezing point of water in Fahrenheit?", "Which planet is known as the Red Planet?",
    "What is the largest desert in the world?", "Who wrote Romeo and Juliet?", "What is an atom made of?",
    "How long does it take the Earth to orbit the Sun?", "What is the national animal of Scotland?",
]
ROLES = [
    "a pirate captain", "a medieval knight", "a tour guide in Paris", "a detective", "a chef in a busy restaurant",
    "an astronaut on the International Space Station", "a museum curator", "a football coach", "a librarian",
    "a travel agent", "a doctor", "a farmer", "a tech support agent", "a history teacher", "a park ranger",
]
CODE_MODULES = [
    "string", "textwrap", "itertools", "functools", "operator", "bisect", "heapq", "statistics", "math", "fractions",
    "random", "json", "base64", "binascii", "shlex", "fnmatch", "glob", "posixpath", "html", "difflib", "calendar",
    "colorsys", "keyword", "copy", "pprint", "zlib", "secrets", "urllib.parse", "email.utils", "ipaddress",
]
DOC_MODULES = [
    "bisect", "heapq", "statistics", "fractions", "decimal", "textwrap", "difflib", "csv", "json", "shlex", "calendar",
    "argparse", "logging", "pickle", "sqlite3", "unittest", "doctest", "collections", "contextlib", "dataclasses",
    "enum", "pathlib", "tempfile", "threading", "queue", "sched", "socket", "string", "struct", "typing", "uuid",
    "zipfile", "tarfile", "gzip", "hashlib", "hmac", "secrets", "random", "datetime", "timeit", "trace", "tokenize",
    "inspect", "ast", "gettext", "locale", "configparser", "mimetypes", "ipaddress", "xml.dom.minidom",
]


def _gsm8k(n: int) -> list[str]:
    rows = GSM8K.read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(r)["question"] for r in rows]


def _first_paragraph(doc: str, limit: int = 400) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ").strip()
    return para[:limit]


def _code_prompts(limit: int = 160) -> list[str]:
    import importlib

    out = []
    for name in CODE_MODULES:
        mod = importlib.import_module(name)
        for fname, fn in sorted(inspect.getmembers(mod, inspect.isfunction)):
            if fname.startswith("_") or not fn.__doc__ or getattr(fn, "__module__", name) != mod.__name__:
                continue
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            doc = _first_paragraph(fn.__doc__)
            if len(doc) < 30:
                continue
            out.append(f"Write a Python function `{fname}{sig}` that does the following: {doc}")
    step = max(1, len(out) // limit)
    return out[::step][:limit]


def _doc_prompts(limit: int = 120) -> list[str]:
    import importlib

    out = []
    for i, name in enumerate(DOC_MODULES):
        mod = importlib.import_module(name)
        doc = inspect.cleandoc(mod.__doc__ or "")
        if len(doc) < 200:
            continue
        text = doc[:1500]
        if i % 2 == 0:
            out.append(f"Summarize the following text in a few sentences.\n\n{text}")
        else:
            out.append(f"Read the passage and answer the question.\n\nPassage: {text}\n\nQuestion: What is the `{name}` module used for?")
        head = mod.__name__.split(".")[-1]
        out.append(f"Explain what the Python `{head}` module does and give a short usage example.")
    return out[:limit]


def mixed_prompts() -> list[str]:
    """The full, ordered prompt list (GSM8K first, then the built ones, interleaved)."""
    general = [tpl.format(t=t) for t in TOPICS for tpl in (WRITING[TOPICS.index(t) % len(WRITING)], EXPLAIN[TOPICS.index(t) % len(EXPLAIN)], EXPLAIN[(TOPICS.index(t) + 3) % len(EXPLAIN)])]
    general += [f"Give me three practical tips for getting better at {t}." for t in ("cooking", "running", "public speaking", "writing", "saving money", "studying", "drawing", "gardening", "learning a language", "time management")]
    general += [f"Rewrite this sentence to sound more formal: {s}" for s in (
        "hey, can u send me the report asap?", "the meeting got moved cuz the boss is sick", "we totally messed up the launch",
        "gonna be late, traffic is crazy", "this new phone is way better than the old one", "thx for the help yesterday",
    )]
    general += [f"Pretend you are {r}. Describe a typical day in your job." for r in ROLES]
    general += [f"Answer the question: {q}" if i % 2 else q for i, q in enumerate(QUESTIONS)]
    translation = [f"Translate German to English: {s}" for s in GERMAN]
    built = general + _code_prompts() + _doc_prompts() + translation
    gsm = _gsm8k(N_GSM8K)
    # interleave, so any prefix of the list (a shorter run) keeps the mix
    out, a, b = [], 0, 0
    while a < len(gsm) or b < len(built):
        if a < len(gsm):
            out.append(gsm[a])
            a += 1
        if b < len(built):
            out.append(built[b])
            b += 1
    return out


if __name__ == "__main__":
    prompts = mixed_prompts()
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if dest:
        dest.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts (python {sys.version_info.major}.{sys.version_info.minor})")
