"""The training prompts of the default DFlash drafter (SmolLM2-135M-Instruct).

GSM8K *train* questions, plus prompts built here from templates, hand-written
German sentences and the Python standard library's own docstrings (code and
documentation prompts), and copy-heavy prompts (summaries and passage questions
over docstrings and GSM8K *train* stories, translations). Nothing comes from
Spec-Bench or HumanEval. The list (``default_prompts()``) is deterministic for a given Python minor version (docstrings differ a little
between versions); ``python benchmarks/drafter/default_drafter_prompts.py OUT.jsonl``
writes it.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k_train.jsonl"
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
GERMAN_MORE = [
    "Die Bäckerei an der Hauptstraße öffnet jeden Morgen um sechs Uhr.",
    "Im Herbst fallen die Blätter von den Bäumen und der Wind wird kälter.",
    "Der Vortrag über künstliche Intelligenz dauerte länger als geplant.",
    "Meine Kollegin hat gestern ihre Doktorarbeit erfolgreich verteidigt.",
    "Die Stadtverwaltung will den Verkehr in der Innenstadt deutlich reduzieren.",
    "Wir haben den Urlaub wegen des schlechten Wetters um eine Woche verschoben.",
    "Das Kind hat zum ersten Mal allein ein ganzes Buch gelesen.",
    "Der Fluss ist nach dem starken Regen über die Ufer getreten.",
    "Viele Menschen arbeiten heute von zu Hause aus und sparen sich den Weg ins Büro.",
    "Die neue Software soll die Arbeit in den Krankenhäusern erleichtern.",
    "Auf dem Markt kann man frisches Obst und Gemüse aus der Region kaufen.",
    "Der Künstler malt seit vierzig Jahren Landschaften aus Norddeutschland.",
    "Die Schüler besuchten im Rahmen des Unterrichts eine alte Burg.",
    "Nach langen Verhandlungen einigten sich die Parteien auf einen Kompromiss.",
    "Das Wasser im See war so klar, dass man bis auf den Grund sehen konnte.",
    "Sie hat ihr Fahrrad verkauft und fährt jetzt mit der Straßenbahn zur Arbeit.",
    "Die Zahl der Touristen in der Stadt hat sich in zehn Jahren verdoppelt.",
    "Wegen einer Baustelle ist die Autobahn bis Montag gesperrt.",
    "Der Hund unserer Nachbarn bellt jede Nacht, wenn der Mond scheint.",
    "Die Forscher untersuchen, wie sich der Klimawandel auf die Wälder auswirkt.",
    "Ich habe meinem Bruder zum Geburtstag eine alte Schallplatte geschenkt.",
    "Das Theater zeigt in dieser Saison drei Stücke von jungen Autoren.",
    "Die Bank hat die Zinsen für Sparkonten erneut gesenkt.",
    "Am Wochenende findet auf dem Marktplatz ein großes Stadtfest statt.",
    "Der Arzt sagte, dass die Erkältung in ein paar Tagen vorbei sein wird.",
    "Wir suchen eine größere Wohnung mit Balkon und einem zusätzlichen Zimmer.",
    "Die Zeitung berichtete ausführlich über den Besuch des Präsidenten.",
    "Mein Großvater erzählt gern von seiner Zeit als Seemann.",
    "Die Firma entwickelt Batterien, die schneller geladen werden können.",
    "Im Winter ist es hier oft neblig und die Tage sind sehr kurz.",
    "Die Studierenden protestierten gegen die höheren Gebühren.",
    "Der Koch bereitet das Gericht nach einem alten Familienrezept zu.",
    "Die Feuerwehr konnte den Brand nach drei Stunden unter Kontrolle bringen.",
    "Das Orchester probt jeden Donnerstagabend in der alten Kirche.",
    "Er hat sich vorgenommen, jeden Tag zehn neue Wörter zu lernen.",
    "Die Regierung will mehr Geld in Schulen und Kindergärten investieren.",
    "Auf der Insel gibt es keine Autos, nur Fahrräder und Pferdekutschen.",
    "Der Verein sucht freiwillige Helfer für das Sommerfest.",
    "Sie schrieb ihrer Freundin einen langen Brief aus Kanada.",
    "Die Äpfel aus unserem Garten schmecken süßer als die aus dem Supermarkt.",
    "Der Zug hielt plötzlich mitten auf der Strecke an.",
    "Das Team arbeitet seit Monaten an einer neuen Version der App.",
    "In der alten Fabrik befindet sich heute ein Kulturzentrum.",
    "Die Wanderung auf den Gipfel dauerte fast sechs Stunden.",
    "Der Minister kündigte an, die Steuern für Familien zu senken.",
    "Unsere Katze schläft am liebsten auf der warmen Fensterbank.",
    "Die Ausstellung über das alte Ägypten lockte viele Besucher an.",
    "Ich habe vergessen, die Blumen zu gießen, bevor wir weggefahren sind.",
    "Die Universität bietet ab dem nächsten Semester einen neuen Studiengang an.",
    "Der Sturm hat in der Nacht mehrere Bäume im Park umgeworfen.",
    "Die Kinder bauten am Strand eine riesige Sandburg.",
    "Der Preis für Strom ist in den letzten Monaten stark gestiegen.",
    "Meine Eltern haben sich vor dreißig Jahren in Wien kennengelernt.",
    "Das Flugzeug landete trotz des Nebels pünktlich in Hamburg.",
    "Die Stadt plant einen neuen Radweg entlang des Flusses.",
    "Er spielt seit seiner Kindheit Klavier und gibt heute selbst Unterricht.",
    "Die Bibliothek bleibt wegen Renovierungsarbeiten bis Ende des Monats geschlossen.",
    "Nach dem Essen gingen wir noch ein Eis essen.",
    "Die Polizei hat den gestohlenen Wagen in einem Wald gefunden.",
    "Das Wetter war perfekt für einen Ausflug mit dem Segelboot.",
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
                sig = re.sub(r" at 0x[0-9a-f]+", "", str(inspect.signature(fn)))  # no memory addresses
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


# -- copy-heavy prompts: the target repeats or rephrases its input --------------------
PASSAGE_MODULES = [
    "argparse", "collections", "configparser", "csv", "difflib", "fileinput", "heapq", "inspect", "itertools", "json",
    "os", "random", "re", "sched", "shelve", "socket", "statistics", "string", "struct", "subprocess", "tempfile",
    "textwrap", "threading", "timeit", "typing", "unittest", "uuid", "functools", "pathlib", "shutil", "datetime",
    "decimal", "fractions", "logging", "zipfile", "tarfile", "pickle", "copy", "enum", "dataclasses", "contextlib",
    "queue", "bisect", "base64", "hashlib", "calendar", "glob", "shlex", "pprint", "weakref", "operator", "codecs",
    "html.parser", "ipaddress", "optparse", "traceback", "warnings", "graphlib",
]
N_COPY = 360
N_FIRST_RUN = 800  # the first data run used mixed_prompts()[:800]
GSM8K_STORIES_FROM = 3000  # GSM8K train rows used as prose passages (the question prompts use the first 640)


def _doc_passages(limit: int = 1400) -> list[tuple[str, str]]:
    """(name, docstring) of stdlib modules, classes and functions with a docstring of 350+ characters."""
    import importlib
    import warnings

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in PASSAGE_MODULES:
            mod = importlib.import_module(name)
            doc = inspect.cleandoc(mod.__doc__ or "")
            if len(doc) >= 350:
                out.append((name, doc[:limit]))
            for member, obj in sorted(inspect.getmembers(mod)):
                if member.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                if getattr(obj, "__module__", None) != mod.__name__:
                    continue
                doc = inspect.getdoc(obj) or ""
                if len(doc) >= 350:
                    out.append((f"{name}.{member}", doc[:limit]))
    return out


def _stories(n: int) -> list[tuple[str, str]]:
    """(passage, question): three GSM8K *train* questions joined into a short story, and its last question."""
    rows = GSM8K.read_text(encoding="utf-8").splitlines()[GSM8K_STORIES_FROM : GSM8K_STORIES_FROM + 3 * n]
    qs = [json.loads(r)["question"].strip() for r in rows]
    out = []
    for j in range(0, len(qs) - 2, 3):
        text = " ".join(qs[j : j + 3])
        last = [s for s in text.replace("?", "?|").split("|") if s.strip().endswith("?")]
        out.append((text, last[-1].strip() if last else "What happens in the story?"))
    return out[:n]


def copy_prompts() -> list[str]:
    """Summaries, passage questions and translations: responses that reuse the prompt's words."""
    docs = _doc_passages()
    stories = _stories(120)
    english = [s for s, _ in stories]
    out: list[list[str]] = [[], [], [], []]
    for j, (name, doc) in enumerate(docs):
        if j % 2 == 0:
            out[0].append(f"Summarize: {doc}")
        else:
            out[1].append(f"{doc}\n\nBased on the text above, what does `{name}` do?")
    for j, (text, question) in enumerate(stories):
        if j % 2 == 0:
            out[0].append(f"Summarize: {text}")
        else:
            out[1].append(f"{text}\n\nAnswer using the passage: {question}")
    out[2] = [f"Translate German to English: {s}" for s in GERMAN_MORE]
    first = [e.split(". ")[0].rstrip(".") + "." for e in english[:40]]
    out[3] = [f"Translate English to {'German' if j % 2 == 0 else 'French'}: {s}" for j, s in enumerate(first)]
    mixed, k = [], 0
    while any(out) and len(mixed) < N_COPY:  # round robin over the four kinds
        if out[k % 4]:
            mixed.append(out[k % 4].pop(0))
        k += 1
    return mixed


# -- verbatim copies: the response is (mostly) the prompt's passage again ---------------
N_REPEAT = 320
GSM8K_REPEAT_FROM = 4000  # GSM8K train rows used as passages to repeat (after the stories' rows)
REPEAT = [
    "Repeat the following text exactly:\n\n{t}",
    "Fix the grammar of this text and return it:\n\n{t}",
    "Copy this passage, then add one sentence at the end:\n\n{t}",
    "Rewrite this text in plain English:\n\n{t}",
]


def _reference_paragraphs(lo: int = 300, hi: int = 900) -> list[str]:
    """Prose paragraphs of the Python language reference that ships with the standard library (pydoc_data)."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            para = " ".join(para.split())
            if lo <= len(para) <= hi and para[0].isupper() and para.count("::=") == 0 and para.count(">>>") == 0:
                out.append(para)
    return out


def repeat_prompts() -> list[str]:
    """Passages to repeat, correct or lightly rewrite: the target copies long spans, so the drafter sees copying."""
    rows = GSM8K.read_text(encoding="utf-8").splitlines()[GSM8K_REPEAT_FROM : GSM8K_REPEAT_FROM + 3 * N_REPEAT]
    qs = [json.loads(r)["question"].strip() for r in rows]
    stories = [" ".join(qs[j : j + 3]) for j in range(0, len(qs) - 2, 3)]
    paras = _reference_paragraphs()
    passages = list(dict.fromkeys(x for pair in zip(paras, stories) for x in pair))[:N_REPEAT]  # a few occur twice
    return [REPEAT[j % len(REPEAT)].format(t=t) for j, t in enumerate(passages)]


def default_prompts() -> list[str]:
    """The default drafter's prompt list: the first N_FIRST_RUN mixed prompts (the first data run),
    then the rest of the built (non-GSM8K) prompts, then the copy-heavy ones. It only grows at its
    end, so cached data of a shorter list stays valid. The shipped drafter does not use
    ``repeat_prompts()`` (``train_default_drafter.py --with-repeats`` appends them; see README)."""
    mixed = mixed_prompts()
    gsm = set(_gsm8k(N_GSM8K))
    return mixed[:N_FIRST_RUN] + [p for p in mixed[N_FIRST_RUN:] if p not in gsm] + copy_prompts()


if __name__ == "__main__":
    prompts = default_prompts()
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if dest:
        dest.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts (python {sys.version_info.major}.{sys.version_info.minor})")
