"""The built-in texts of `pyspec agree`: short, original passages across the
kinds of text people generate (code, prose, math, chat), so that one run shows
how two models agree on each. Chat texts are conversations, rendered with the
reference's chat template when it has one."""

from __future__ import annotations

from typing import Dict, List, Tuple, Union

Conversation = List[Tuple[str, str]]  # (role, content)

TEXTS: Dict[str, List[Union[str, Conversation]]] = {
    "code": [
        '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals; returns a new sorted list."""
    if not intervals:
        return []
    intervals = sorted(intervals, key=lambda iv: iv[0])
    merged = [list(intervals[0])]
    for start, end in intervals[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return merged


if __name__ == "__main__":
    print(merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]))
''',
        '''#include <stdio.h>
#include <stdlib.h>

/* Count the words of a file: a word is a run of characters that are not spaces. */
int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\\n", argv[0]);
        return 1;
    }
    FILE *f = fopen(argv[1], "r");
    if (f == NULL) {
        perror(argv[1]);
        return 1;
    }
    long words = 0;
    int c, in_word = 0;
    while ((c = fgetc(f)) != EOF) {
        if (c == ' ' || c == '\\n' || c == '\\t') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            words++;
        }
    }
    fclose(f);
    printf("%ld\\n", words);
    return 0;
}
''',
    ],
    "prose": [
        "The harbour town woke slowly. Fishermen carried their nets down to the water while the bakery on the "
        "corner filled the street with the smell of bread. By eight o'clock the market was busy: farmers sold "
        "apples and cheese, children ran between the stalls, and an old man played the accordion near the "
        "fountain. Nobody noticed the small boat that had come in before dawn, or the woman who stepped out of "
        "it with a leather case under her arm.",
        "Bees communicate the location of food through a behaviour known as the waggle dance. A forager that has "
        "found a rich patch of flowers returns to the hive and moves in a figure-eight pattern on the vertical "
        "comb. The angle of the straight run relative to vertical tells the other bees the direction of the food "
        "relative to the sun, and the duration of the run tells them the distance. Researchers have decoded these "
        "dances to map where colonies forage across a landscape.",
    ],
    "math": [
        "Problem: A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average speed for "
        "the whole journey?\nSolution: The total distance is 180 + 120 = 300 km. The total time is 2 + 1.5 = 3.5 "
        "hours. The average speed is the total distance divided by the total time: 300 / 3.5 = 85.71 km/h. So the "
        "average speed is about 85.7 km/h.",
        "Let us prove that the sum of the first n odd numbers is n^2. For n = 1 the sum is 1 = 1^2. Suppose the "
        "statement holds for n, so 1 + 3 + ... + (2n - 1) = n^2. Adding the next odd number, 2n + 1, gives "
        "n^2 + 2n + 1 = (n + 1)^2, which is the statement for n + 1. By induction, the sum of the first n odd "
        "numbers is n^2 for every positive integer n.",
    ],
    "chat": [
        [("user", "How do I reverse a list in Python?"),
         ("assistant", "You can reverse a list in place with `my_list.reverse()`, or get a reversed copy with "
                       "slicing: `reversed_list = my_list[::-1]`. If you only need to iterate backwards, "
                       "`for item in reversed(my_list):` avoids making a copy.")],
        [("user", "What should I pack for a weekend hiking trip in the mountains?"),
         ("assistant", "Bring layers: a base layer, a warm fleece and a waterproof jacket, since mountain "
                       "weather changes quickly. Pack sturdy boots, a map and compass or a charged phone with "
                       "offline maps, plenty of water, snacks with protein, a first-aid kit, a headlamp and "
                       "sunscreen. Tell someone your route and when you expect to be back.")],
    ],
}
