"""Stands in for nltk (its punkt data is downloaded at run time): sentence splitting on full stops."""

import re


class data:  # lower case: it mirrors the module nltk.data
    @staticmethod
    def find(name):
        return name


def download(*args, **kwargs):
    return True


def sent_tokenize(text, language="english"):
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
