"""What the spoken form costs: median and p95 milliseconds per sentence of ``normalize_mapped``, on sentences with
numbers, money, dates, units and abbreviations, and on plain sentences; with the spoken form and without it (only
cleaned: unicode, quotes, blanks).

    python -m bench.spoken
"""

from __future__ import annotations

import statistics
import time

from rtvoice.engine.text import normalize_mapped

MIXED = [
    "It costs $1,250.75 to fly on 07/04/1990 at 10:45 a.m.",
    "Add 2 tbsp. of sugar and 3/4 cup of milk at 350\u00b0F.",
    "Henry VIII was born in 1491 and had 6 wives.",
    "Call 555-123-4567 or mail info@example.com before 5 p.m.",
    "Prices rose 5.5% in 2023, about $3.2 million in all.",
    "Dr. Smith lives at 12 Main St. and drives 60 mph.",
    "The train leaves at 18:20 from platform 9 and arrives at 21:05.",
    "Chapter IV starts on page 112, e.g. after the map.",
    "She finished 2nd out of 1,500 runners in the 10 km race.",
    "Temperatures hit 38\u00b0C, about 100\u00b0F, on July 4, 1990.",
    "The 1990s saw the price fall from \u00a31.50 to 99p.",
    "Our revenue was $2.5 billion, up 12% from 2022.",
    "Visit https://www.example.com/docs for the 3 steps.",
    "World War II ended in 1945, after 6 years.",
    "Mix 1 tsp salt with 2 lbs. of flour, etc.",
    "Louis XIV ruled for 72 years, from 1643 to 1715.",
    "Call +44 20 7946 0958 before 9 a.m. on 12/25/2024.",
    "We need approx. 250 kg of sand vs. 100 kg of gravel.",
    "Room 101 is on the 3rd floor, No. 7.",
    "He paid \u20ac45.99 for 2 tickets at 7:30 pm.",
]
PLAIN = [
    "My sister bought a small house near the river last summer.",
    "Please call me back before five o'clock tomorrow afternoon.",
    "When the committee finally gathered in the old library, everyone expected a short meeting.",
    "I think the weather will be better tomorrow, so we can go to the beach.",
    "She opened the door slowly and looked outside into the dark garden.",
    "The children laughed as the dog chased its tail around the yard.",
    "Thank you for calling, how can I help you today?",
    "We walked along the quiet streets until the sun went down.",
    "Could you tell me where the nearest train station is?",
    "He said that he would finish the report by the end of the week.",
    "The old bridge over the river was closed for repairs all winter.",
    "Our team has been working hard on the new design for months.",
    "If you have any questions, please do not hesitate to ask.",
    "The museum opens early on weekends and closes late on Fridays.",
    "They decided to cook dinner at home instead of going out.",
    "Music filled the room as the guests arrived one by one.",
    "I am not sure whether the package arrived yesterday or today.",
    "The mountains looked beautiful under the fresh snow this morning.",
    "Remember to turn off the lights before you leave the office.",
    "Everyone agreed that the meeting had gone better than expected.",
]


def timings_ms(texts: list[str], spoken: bool, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        for text in texts:
            started = time.perf_counter()
            normalize_mapped(text, "en_US", spoken=spoken)
            times.append((time.perf_counter() - started) * 1000)
    return times


def main(rounds: int = 20) -> None:
    started = time.perf_counter()
    normalize_mapped(MIXED[0])
    print(f"first call (wetext's grammars load): {(time.perf_counter() - started) * 1000:.0f} ms")
    print(f"{'sentences':>9} {'spoken form':>11} {'median ms':>9} {'p95 ms':>7}")
    for name, texts in (("mixed", MIXED), ("plain", PLAIN)):
        for spoken in (True, False):
            times = timings_ms(texts, spoken, rounds)
            p95 = statistics.quantiles(times, n=20)[-1]
            print(f"{name:>9} {'yes' if spoken else 'no':>11} {statistics.median(times):9.3f} {p95:7.3f}")
    for text in MIXED:
        print(f"  {text}\n    {normalize_mapped(text).text}")


if __name__ == "__main__":
    main()
