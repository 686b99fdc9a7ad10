"""Reading user data and turning it into token tensors: files and formats (records), SFT examples with the loss mask
(sft), a record's images read, checked and placed (images) and examples with them for a vision-language model
(multimodal), the rows of an RL prompt file (prompts), preference pairs and ranked lists for reward models (preferences) and for the policy (dpo), annotator votes
(votes), step-labelled solutions for process reward models (steps), and the counterfactual probes of reward models and
judges (probes).

May import: algorithms, errors, console, config, sections, models (the tokenizer's end-of-turn token, packing, the
processor's image token).
"""
