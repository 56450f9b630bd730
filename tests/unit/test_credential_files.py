"""The code snapshot never copies a credential, in a git work tree or a walked folder, and still copies the
files a training job needs (a tokenizer, code that handles credentials)."""

import subprocess

import pytest

from hpc.cluster import snapshot
from hpc.cluster.credential_files import holds_private_key, is_credential

SECRET_NAMES = ["conf/.secrets.yaml", "secrets.json", "config/secrets.toml", "Secrets.YAML", ".env.local",
                "deploy/prod.env", "credentials.yaml", "conf/credentials", "gcp-credentials.json", "creds.json",
                "hf_token", ".token", "token.txt", "github_access_token.json", "db-password.txt", "passwords.csv",
                "htpasswd", "api_key.txt", "aws_access_keys.csv", "private-key.txt", "client_secret_123.json",
                "secrets/prod.yaml", ".secrets/db.ini", "ID_RSA", "server.PEM", "user.ppk", "svc.keytab",
                ".kaggle/kaggle.json", ".huggingface/token", ".bash_history", ".pgpass", ".netrc", ".databrickscfg"]
KEPT_NAMES = ["train.py", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokens.txt",
              "token-classification/requirements.txt", "auth/credentials.py", "secrets.py", "utils/passwords.py",
              "id_rsa.pub", "conf/id_map.py", "secretion_rates.csv", "keys.json", "environment.yml", "config.yaml"]


@pytest.mark.parametrize("rel", SECRET_NAMES)
def test_names_that_hold_credentials(rel):
    assert is_credential(rel)


@pytest.mark.parametrize("rel", KEPT_NAMES)
def test_names_a_job_needs_are_kept(rel):
    assert not is_credential(rel)


BODY = "MIIEpAIBAAKCAQEA" + "q" * 64
KEYS = {"starts.txt": "-----BEGIN RSA PRIVATE KEY-----\n",
        "pasted.yaml": f"db:\n  tls_key: |\n    -----BEGIN PRIVATE KEY-----\n    {BODY}\n",
        "my-project-1a2b.json": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
                                f'{BODY}\\n-----END PRIVATE KEY-----\\n"}}',
        "bom.txt": "\ufeff-----BEGIN OPENSSH PRIVATE KEY-----\n",
        "putty.txt": "PuTTY-User-Key-File-3: ssh-ed25519\n",
        "pgp.txt": f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{BODY}\n"}
NOT_KEYS = {"parse.py": 'if line.startswith("-----BEGIN RSA PRIVATE KEY-----"):\n    kind = "rsa"\n',
            "public.txt": f"-----BEGIN PUBLIC KEY-----\n{BODY}\n"}


@pytest.mark.parametrize("name", [*KEYS, *NOT_KEYS])
def test_a_private_key_is_found_by_its_text(tmp_path, name):
    (tmp_path / name).write_text({**KEYS, **NOT_KEYS}[name])
    assert holds_private_key(tmp_path / name) == (name in KEYS)


@pytest.mark.parametrize("mode", ["git", "walk"])
def test_the_snapshot_leaves_out_secrets_files_in_both_modes(tmp_path, mode):
    project = tmp_path / "project"
    secrets = ["conf/.secrets.yaml", "secrets.json", "conf/credentials.yaml", "hf_token.txt", "secrets/db.yaml",
               "conf/service.json"]
    kept = ["train.py", "conf/model.yaml", "tokenizer.json", "auth/credentials.py"]
    for rel in [*secrets, *kept]:
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text("password: hunter2\n")
    (project / "conf/service.json").write_text(KEYS["my-project-1a2b.json"])  # a key file with a plain name
    if mode == "git":
        subprocess.run(["git", "init", "-q"], cwd=project, check=True)
        subprocess.run(["git", "add", "-f", "-A"], cwd=project, check=True)
    _, info = snapshot.take(project, tmp_path / "code", exclude_dirs=[])
    assert info["source"] == mode
    copied = sorted(p.relative_to(tmp_path / "code").as_posix() for p in (tmp_path / "code").rglob("*")
                    if p.is_file())
    assert copied == sorted(kept)
    assert sorted(info["left_out"]) == sorted(secrets)
