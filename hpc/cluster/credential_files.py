"""Which files of a project hold credentials, so the code snapshot never copies them.

The job folder is read on the cluster, by its admins and its backups, so a credential left in it has leaked. Three
rules, each for what the one before cannot see:

- names and paths that tools use for credentials (``.netrc``, ``id_rsa``, ``*.pem``, ``.aws/credentials``, ...);
- a name or folder that says so in words (``conf/.secrets.yaml``, ``secrets.json``, ``credentials.yaml``,
  ``hf_token``, ``db-password.txt``, ``secrets/prod.yaml``), for any file but code: a module named after
  credentials is usually code that handles them (``auth/credentials.py``), and leaving it out breaks the job's
  imports;
- a private key's text near the top of a file, whatever its name.

Names are compared in lower case: ``Secrets.YAML`` and ``ID_RSA`` are the same files to a user.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

# file names (any folder) that tools keep credentials in
NAMES = (".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc",
         ".yarnrc", ".yarnrc.yml", ".pgpass", ".my.cnf", ".s3cfg", ".boto", ".htpasswd", "htpasswd", ".vault-token",
         ".databrickscfg", ".cdsapirc", ".comet.config", "rclone.conf", "kaggle.json", "auth.json", ".dockercfg",
         "*.pem", "*.key", "*.p12", "*.pfx", "*.p8", "*.jks", "*.keystore", "*.kdbx", "*.gpg", "*.ppk", "*.keytab",
         "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk", "id_*",
         "*_rsa", "*_dsa", "*_ecdsa", "*_ed25519", "service-account*.json", "*.tfvars", "terraform.tfstate*",
         ".*_history")  # shell and Python histories keep the `export HF_TOKEN=...` typed into them
# paths (from any folder down) that tools keep credentials in
PATHS = (".aws/*", ".ssh/*", ".gnupg/*", ".docker/config.json", ".kube/config", ".kube/*.yaml", ".kaggle/*",
         ".config/gcloud/*", ".azure/*", ".terraform.d/credentials*", ".config/hub", ".config/gh/hosts.yml",
         ".huggingface/*", ".cache/huggingface/*")
# the words, in a file's or a folder's name, at the end of a word (a prefix may be glued on: mysecrets,
# gcpcredentials, htpasswd)
WORDS = re.compile(r"(secrets?|credentials?|(?<![a-z])creds|passw(?:or)?ds?|passphrase"
                   r"|(?:api|access|private|secret)[-_.]?keys?)(?![a-z])")
# "token" only where a file's name ends with it (hf_token, .token, access_token.json): token-classification/ is an
# NLP task's folder, tokens.txt and tokenizer.json are a model's vocabulary
TOKEN = re.compile(r"token(?:\.[a-z0-9]+)?$")
# what a word in the name does not decide: source code (see the module's docstring)
CODE_SUFFIXES = (".py", ".pyi", ".pyx", ".pxd", ".ipynb", ".sh", ".bash", ".c", ".cc", ".cpp", ".cu", ".h", ".hpp",
                 ".rs", ".go", ".jl", ".r", ".js", ".ts", ".j2", ".jinja")
KEY_HEAD_BYTES = 64 * 1024  # where a private key pasted into a config file is looked for
# a key's header line, then its base64 within a few lines (PEM's Proc-Type/DEK-Info headers may come between);
# the line break may be JSON's "\n", as in a cloud service account's key file, whatever it is named
PEM_WITH_BODY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[ \t]*(?:\r?\n|\\n)"
                           rb"[\s\S]{0,200}?[A-Za-z0-9+/]{40}")


def is_credential(rel: str) -> bool:
    """A path (relative to the project) whose name says it holds a secret. ``id_*`` is a key unless it has a
    suffix (id_rsa.pub is left alone, as is id_map.py)."""
    parts = rel.lower().split("/")
    name = parts[-1]
    if name.startswith("id_") and "." in name:
        return name.endswith((".pem", ".key"))
    if any(fnmatch.fnmatchcase(name, pat) for pat in NAMES):
        return True
    if any(fnmatch.fnmatchcase("/".join(parts[i:]), pat) for i in range(len(parts) - 1) for pat in PATHS):
        return True
    if name.endswith(CODE_SUFFIXES):
        return False
    return TOKEN.search(name) is not None or any(WORDS.search(part) for part in parts)


def holds_private_key(path: Path) -> bool:
    """A PEM, OpenSSH, PGP or PuTTY private key: the file starts with one, or has one, with its body, near the top
    (a key pasted into a YAML file). A key's header alone inside a file (code that parses keys) is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(KEY_HEAD_BYTES)
    except OSError:
        return False
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"PuTTY-User-Key-File-") or (start.startswith(b"-----BEGIN ") and b"PRIVATE KEY" in start[:64]):
        return True
    return PEM_WITH_BODY.search(head) is not None
