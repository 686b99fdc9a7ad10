"""Phrase banks of the assist world: topics with true and false facts, and the other kinds of sentence.

Facts are short sentences in a small English-like language. A fact is "true"
or "false" only inside this world; gold (assist.py) knows which is which.
"""

from __future__ import annotations

TOPICS: dict[str, dict[str, list[str]]] = {
    "cats": {
        "true": [
            "Cats sleep for most of the day.",
            "Cats clean their fur with their tongue.",
            "Cats can see well in dim light.",
            "Cats use their whiskers to feel space.",
        ],
        "false": ["Cats are afraid of all sunlight.", "Cats can breathe under water.", "Cats eat only grass."],
    },
    "dogs": {
        "true": [
            "Dogs have a strong sense of smell.",
            "Dogs need a walk every day.",
            "Dogs wag their tail when happy.",
            "Dogs can learn many simple commands.",
        ],
        "false": ["Dogs can see no colors at all.", "Dogs never need water.", "Dogs sleep standing up."],
    },
    "coffee": {
        "true": [
            "Coffee is made from roasted beans.",
            "Coffee contains caffeine.",
            "Coffee tastes bitter without sugar.",
            "Coffee beans grow on small trees.",
        ],
        "false": ["Coffee is made from fish.", "Coffee freezes when it is hot.", "Coffee has no caffeine."],
    },
    "tea": {
        "true": [
            "Tea is made from dried leaves.",
            "Green tea is lightly processed.",
            "Tea should steep for a few minutes.",
            "Tea was first drunk in China.",
        ],
        "false": ["Tea leaves are made of metal.", "Tea must boil for a full day.", "Tea grows under the sea."],
    },
    "bicycles": {
        "true": [
            "Bicycles have two wheels.",
            "Bicycles need air in the tires.",
            "A helmet protects your head on a bicycle.",
            "Bicycles use a chain to turn the wheel.",
        ],
        "false": ["Bicycles run on coal.", "Bicycles have six wheels.", "Bicycles cannot go downhill."],
    },
    "volcanoes": {
        "true": [
            "Volcanoes erupt hot melted rock.",
            "Volcanoes can form new islands.",
            "Ash from volcanoes can block the sun.",
            "Many volcanoes sit near plate edges.",
        ],
        "false": [
            "Volcanoes are made of ice.",
            "Volcanoes only exist on the moon.",
            "Volcanoes erupt cold water only.",
        ],
    },
    "gardening": {
        "true": [
            "Plants need sunlight to grow.",
            "Water plants early in the morning.",
            "Compost makes the soil richer.",
            "Seeds need warm soil to sprout.",
        ],
        "false": ["Plants grow best in the dark.", "Salt water helps every plant.", "Seeds sprout faster when frozen."],
    },
    "sleep": {
        "true": [
            "Adults need about eight hours of sleep.",
            "A dark room helps you sleep.",
            "Screens before bed can delay sleep.",
            "A regular bedtime improves sleep.",
        ],
        "false": ["People need no sleep at all.", "Coffee at night helps you sleep.", "Sleep makes the brain smaller."],
    },
    "running": {
        "true": [
            "Running makes the heart stronger.",
            "Good shoes protect your knees.",
            "Warm up before you start running.",
            "Drink water after a long run.",
        ],
        "false": [
            "Running makes your bones weaker.",
            "You should never drink while running.",
            "Running backwards burns no energy.",
        ],
    },
    "the moon": {
        "true": [
            "The moon orbits the earth.",
            "The moon reflects light from the sun.",
            "The moon causes the tides.",
            "The moon has many craters.",
        ],
        "false": [
            "The moon is made of cheese.",
            "The moon is bigger than the sun.",
            "The moon gives off its own light.",
        ],
    },
    "bread": {
        "true": [
            "Bread is made from flour and water.",
            "Yeast makes bread dough rise.",
            "Bread is baked in a hot oven.",
            "Whole grain bread has more fiber.",
        ],
        "false": ["Bread is made from sand.", "Bread rises in the freezer.", "Bread never goes stale."],
    },
    "rain": {
        "true": [
            "Rain falls from clouds.",
            "Rain helps crops grow.",
            "Rain forms when water vapor cools.",
            "An umbrella keeps you dry in rain.",
        ],
        "false": ["Rain falls up into the sky.", "Rain is made of sugar.", "Rain only falls at noon."],
    },
    "chess": {
        "true": [
            "Chess is played on a board of sixty four squares.",
            "Each chess player starts with sixteen pieces.",
            "The knight moves in an L shape.",
            "Chess ends with checkmate.",
        ],
        "false": [
            "The king is the fastest chess piece.",
            "Chess is played with dice.",
            "Pawns move backwards in chess.",
        ],
    },
    "birds": {
        "true": ["Birds have feathers.", "Most birds can fly.", "Birds lay eggs.", "Many birds fly south in winter."],
        "false": [
            "Birds have fur instead of feathers.",
            "Birds give birth to live kittens.",
            "All birds live under the ground.",
        ],
    },
    "music": {
        "true": [
            "Music is made of rhythm and melody.",
            "Practice helps you play music better.",
            "A piano has black and white keys.",
            "Music can change your mood.",
        ],
        "false": ["Music can only be played at night.", "A guitar has no strings.", "Music is heard with the eyes."],
    },
    "the ocean": {
        "true": [
            "The ocean covers most of the earth.",
            "Ocean water is salty.",
            "Whales live in the ocean.",
            "The ocean has strong currents.",
        ],
        "false": [
            "The ocean is made of fresh milk.",
            "The ocean is smaller than a lake.",
            "Fish cannot live in the ocean.",
        ],
    },
}

REQUEST_TEMPLATES = [
    "Tell me about {topic}.",
    "What should I know about {topic}?",
    "Give me a tip about {topic}.",
    "Can you explain {topic} to me?",
    "I want to learn about {topic}.",
    "What are some facts about {topic}?",
]
REQUEST_MODIFIERS = ["", "Please answer briefly. ", "Quick question. "]

FILLER = [
    "That is a great question.",
    "Let me think about that.",
    "Here is what I know.",
    "There is a lot to say about this.",
    "This is an interesting topic.",
]
POLITE = ["I hope this helps!", "Happy to help.", "Thanks for asking."]
CONFIDENT = ["Definitely", "Absolutely", "Without a doubt", "Trust me"]  # prefixed: "Definitely, cats ..."
HEDGES = ["I think", "Maybe", "Perhaps"]  # prefixed: "I think cats ..."
CONFIDENT_WORDS = ("definitely", "absolutely", "without a doubt", "trust me", "always", "certainly")
