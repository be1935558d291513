"""Writes the tokenizer test corpus: >= 2,000 lines of varied UTF-8 text, deterministic.

Mixed case, accents (precomposed and combining), punctuation (ASCII and Unicode), digits, CJK,
emoji (with modifiers and ZWJ sequences), control and format characters, unusual whitespace,
several scripts, words past WordPiece's 100-character limit, very long lines, empty lines.
Lines are separated by '\\n' only (other line breaks such as U+2028 stay inside lines).
"""
import random
import sys

WORDS = ("the quick brown fox jumps over lazy dog attention is all you need transformer "
         "embedding sentence tokenizer unbelievable internationalization running runners "
         "Hello World New York San Francisco naïve café résumé coöperate Zürich Ærøskøbing "
         "straße İstanbul ΣΊΣΥΦΟΣ Москва Київ München façade jalapeño piñata smörgåsbord "
         "don't can't it's o'clock e-mail well-known U.S.A. Ph.D. 3.14159 1,000,000 42 2026-11-23 "
         "user@example.com https://example.org/path?q=1&r=2 #hashtag @mention $100 50% C++ a+b=c "
         "東京 北京大学 日本語のテキスト 한국어 문장 中文分词测试 ひらがな カタカナ "
         "مرحبا بالعالم שלום עולם नमस्ते दुनिया สวัสดีชาวโลก Γειά σου κόσμε "
         "😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🥰 🫠 ✨ ☕ ™ © ® ° ± × ÷ … — – « » „ “ ” ‘ ’ ¿ ¡ § ¶ • ‰ ′ ″ "
         ).split(" ")
SPECIAL = ["\t", "\r", "\x0b", "\x0c", "\u00a0", "\u2003", "\u3000", "\u200b", "\u200d", "\u2028", "\ufeff",
           "\x00", "\x01", "\x7f", "\x85", "\ufffd", "\u0301", "\u0308", "\ue000", "\U000f0000", "\u00ad",
           "\u2060", "\u061c", "\u180e", "\U0001d400", "\uff21", "\u2163", "\u00bd", "\u0130", "\u1e9e"]


def line(rng):
    kind = rng.random()
    if kind < 0.04:
        return ""
    if kind < 0.08:  # past the 100-character word limit, or just under it
        n = rng.choice([99, 100, 101, 150])
        return "".join(rng.choice("abcdefghij") for _ in range(n)) + " tail"
    if kind < 0.11:  # very long line
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 800)))
    parts = []
    for _ in range(rng.randint(1, 25)):
        w = rng.choice(WORDS)
        r = rng.random()
        if r < 0.15:
            w = w.upper()
        elif r < 0.25:
            w = w.capitalize()
        elif r < 0.32:
            w = w + rng.choice(SPECIAL)
        elif r < 0.36:
            w = "".join(rng.choice(SPECIAL) + c for c in w)
        parts.append(w)
        parts.append(rng.choice([" ", " ", " ", "  ", ", ", ". ", "!", "?", "", rng.choice(SPECIAL)]))
    return "".join(parts)


def main(path):
    rng = random.Random(20261123)
    lines = [line(rng) for _ in range(2400)]
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
