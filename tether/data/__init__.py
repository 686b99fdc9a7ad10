"""Reading user data (records.py) and turning it into token tensors (sft.py)."""
