"""NVIDIA's package repository (or the inventory mirror): signing key pinned by fingerprint, proxy, CA.

Credentials in the mirror or proxy URL never reach a world-readable file: apt gets them from an auth.conf.d
file (mode 0600, apt_auth.conf(5)) and the URLs without them; a dnf .repo file carrying them is mode 0600.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from urllib.parse import unquote, urlsplit, urlunsplit

from gpuprov.core.errors import InputError, mask_credentials
from gpuprov.core.operations import Change, OpContext, file_change, q, write_file
from gpuprov.core.secrets import register_url

COMPONENT = "sources"
APT_LIST = "/etc/apt/sources.list.d/gpuprov-nvidia.list"
APT_KEYRING = "/usr/share/keyrings/gpuprov-nvidia.gpg"
APT_PROXY = "/etc/apt/apt.conf.d/95gpuprov-proxy"
APT_AUTH = "/etc/apt/auth.conf.d/gpuprov-nvidia.conf"
DEB_CA = "/usr/local/share/ca-certificates/gpuprov-extra.crt"
DNF_REPO = "/etc/yum.repos.d/gpuprov-nvidia.repo"
RPM_KEY = "/etc/pki/rpm-gpg/RPM-GPG-KEY-gpuprov-nvidia"
RHEL_CA = "/etc/pki/ca-trust/source/anchors/gpuprov-extra.crt"
KEY_STAMP = "/etc/gpuprov/repo-key.fingerprint"
FILES = (APT_LIST, APT_KEYRING, APT_PROXY, APT_AUTH, DEB_CA, DNF_REPO, RPM_KEY, RHEL_CA, KEY_STAMP)
SECRET_MODE = "0600"

_URL = re.compile(r"(https?|file)://[^\s\x00-\x1f\x7f]+")
_PROXY = re.compile(r"https?://[^\s\x00-\x1f\x7f\"]+")
_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
# a login token of apt_auth.conf(5) / a dnf setting value: no whitespace, and no quote or backslash (which
# would also keep mask_credentials from finding the whole secret in shell-quoted or JSON text)
_TOKEN = re.compile(r"[^\s\"'\\]+")
HEADER = "Managed by gpuprov; local edits are replaced on the next provision run."


def _bad(ctx: OpContext, message: str, hint: str) -> InputError:
    return InputError(message, host=ctx.host, step=COMPONENT, hint=hint)


def split_credentials(ctx: OpContext, url: str, setting: str) -> tuple[str, tuple[str, str] | None]:
    """`url` without its `user:password@`, and the (user, password) it carried, percent-decoded."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    register_url(url)  # masked by value wherever it shows: auth.conf text, diffs, reports
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if not (_TOKEN.fullmatch(user) and _TOKEN.fullmatch(password)):
        raise _bad(ctx, f"the credentials in {setting} {mask_credentials(url)!r} need a user and a password, "
                   "neither with whitespace, quotes or backslashes",
                   f"fix {setting} in the inventory (https://USER:PASSWORD@HOST/PATH, percent-encoded)")
    return bare, (user, password)


def auth_conf(ctx: OpContext) -> str | None:
    """apt_auth.conf(5) entries for a mirror and a proxy that carry credentials (None: neither does). The
    machine token names the protocol: without one an entry matches https only."""
    entries = []
    for url, setting in ((ctx.repo.url, "mirror.url"), (ctx.repo.proxy, "mirror.proxy")):
        bare, login = split_credentials(ctx, url, setting) if url else (url, None)
        if login is not None:
            entries.append(f"machine {bare.rstrip('/')} login {login[0]} password {login[1]}\n")
    return "".join(entries) or None


def fingerprint(ctx: OpContext) -> str:
    """The pinned key fingerprint, normalized (40 upper-case hex digits); no fingerprint, no trust."""
    raw = ctx.repo.fingerprint
    value = re.sub(r"\s+", "", raw or "").upper()
    if not _FINGERPRINT.fullmatch(value):
        raise _bad(ctx, f"repository signing key fingerprint {raw!r} is not a 40-digit hex fingerprint",
                   "set mirror.fingerprint in the inventory (gpg --show-keys KEYFILE prints it)")
    return value


def validate(ctx: OpContext) -> None:
    repo = ctx.repo
    if not _URL.fullmatch(repo.url or ""):
        raise _bad(ctx, f"repository URL {mask_credentials(repo.url or '')!r} is not an http(s):// or file:// "
                   "URL without spaces", "fix mirror.url in the inventory")
    if repo.proxy is not None and not _PROXY.fullmatch(repo.proxy):
        raise _bad(ctx, f"proxy {mask_credentials(repo.proxy)!r} is not an http(s):// URL without spaces or "
                   "quotes", "fix mirror.proxy in the inventory")
    if repo.key_data is None and not (repo.key_url and _URL.fullmatch(repo.key_url)):
        raise _bad(ctx, "the repository has no signing key: neither key data nor an http(s)/file key URL",
                   "set mirror.key_file in the inventory, or use NVIDIA's repository")
    if repo.ca_pem is not None and "-----BEGIN CERTIFICATE-----" not in repo.ca_pem:
        raise _bad(ctx, "the extra CA is not a PEM certificate", "point mirror.ca_file at a PEM file")
    fingerprint(ctx)


def _tools_command(ctx: OpContext) -> str:
    """Install curl, gpg and the CA tooling only when one is missing (minimal images lack them)."""
    if ctx.family == "debian":
        check = "command -v curl && command -v gpg && command -v update-ca-certificates"
        install = f"{ctx.pm.update()} && {ctx.pm.install_names(['ca-certificates', 'curl', 'gnupg'])}"
    else:
        check = "command -v curl && command -v gpg && command -v update-ca-trust"
        install = ctx.pm.install_names(["ca-certificates", "curl", "gnupg2"])
    return f"{{ {check}; }} >/dev/null 2>&1 || {{ {install}; }}"


def key_command(repo_key_url: str | None, key_data: str | None, fpr: str, keyring: str, armored: bool,
                stamp: str, proxy: str | None = None) -> str:
    """Fetch the key, refuse it unless it is exactly one primary key with fingerprint `fpr`, install it."""
    if key_data is not None:
        fetch = f'printf %s {q(key_data)} > "$d/key"'
        source = "the mirror key file"
    else:
        # the proxy (it may carry a login) reaches curl through its config on stdin, printed by the shell's
        # printf builtin: never on a command line
        config = f"printf 'proxy = \"%s\"\\n' {q(proxy)} | " if proxy else ""
        fetch = (f'{config}curl {"-K - " if proxy else ""}-fsSL --retry 3 --connect-timeout 20 -o "$d/key" '
                 f'{q(repo_key_url or "")}')
        source = repo_key_url or ""
    mismatch = ("gpuprov: the signing key from %s has fingerprint(s) '%s', expected %s; not trusting it. "
                "Check the key source and the fingerprint in the inventory.\\n")
    export = "--armor --export" if armored else "--export"
    return ("( d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && export GNUPGHOME=\"$d\" && "
            f"{fetch} && "
            "got=$(gpg --batch --with-colons --show-keys \"$d/key\" | "
            "awk -F: '$1==\"pub\"{p=1;next} p&&$1==\"fpr\"{print $10;p=0}' | tr '\\n' ' ' | sed 's/ *$//') && "
            f"if [ \"$got\" != {q(fpr)} ]; then printf {q(mismatch)} {q(source)} \"$got\" {q(fpr)} >&2; exit 1; fi && "
            f"gpg --batch --quiet --import \"$d/key\" && gpg --batch {export} {q(fpr)} > \"$d/out\" && "
            f"mkdir -p {q(keyring.rsplit('/', 1)[0])} && install -m 0644 \"$d/out\" {q(keyring)} && "
            f"{write_file(stamp, fpr + chr(10))} )")


def dnf_repo(ctx: OpContext) -> tuple[str, str]:
    """The .repo file and its mode (0600 when it carries credentials)."""
    url, login = split_credentials(ctx, ctx.repo.url, "mirror.url")
    proxy, proxy_login = split_credentials(ctx, ctx.repo.proxy, "mirror.proxy") if ctx.repo.proxy else (None, None)
    lines = [f"# {HEADER}", "# module_hotfixes: exact versions install without enabling a module stream.",
             "[gpuprov-nvidia]", "name=NVIDIA CUDA repository (gpuprov)", f"baseurl={url}", "enabled=1",
             "gpgcheck=1", f"gpgkey=file://{RPM_KEY}", "module_hotfixes=1"]
    if login:
        lines += [f"username={login[0]}", f"password={login[1]}"]
    if proxy:
        lines.append(f"proxy={proxy}")
    if proxy_login:
        lines += [f"proxy_username={proxy_login[0]}", f"proxy_password={proxy_login[1]}"]
    return "\n".join(lines) + "\n", SECRET_MODE if login or proxy_login else "0644"


def changes(ctx: OpContext) -> Iterator[Change]:
    validate(ctx)
    repo = ctx.repo
    debian = ctx.family == "debian"
    fpr = fingerprint(ctx)
    planned: list[Change] = []

    if debian:
        proxy = None if repo.proxy is None else split_credentials(ctx, repo.proxy, "mirror.proxy")[0]
        proxy_conf = None if proxy is None else (
            f"// {HEADER}\nAcquire::http::Proxy \"{proxy}\";\nAcquire::https::Proxy \"{proxy}\";\n")
        planned.append(file_change(ctx, COMPONENT, APT_PROXY, proxy_conf, "apt proxy"))
        planned.append(file_change(ctx, COMPONENT, APT_AUTH, auth_conf(ctx), "apt login for the mirror/proxy",
                                   mode=SECRET_MODE))

    ca_path, ca_update = (DEB_CA, "update-ca-certificates") if debian else (RHEL_CA, "update-ca-trust")
    ca = None if repo.ca_pem is None else repo.ca_pem.rstrip("\n") + "\n"
    if ctx.file(ca_path) != ca:
        tools = (_tools_command(ctx),) if ca is not None else ()
        change = file_change(ctx, COMPONENT, ca_path, ca, "extra CA certificate", then=(ca_update,))
        planned.append(replace(change, commands=tools + change.commands))

    keyring = APT_KEYRING if debian else RPM_KEY
    if ctx.file(KEY_STAMP) != fpr + "\n" or ctx.file(keyring) is None:
        source = "mirror key file" if repo.key_data is not None else mask_credentials(repo.key_url or "")
        planned.append(Change(COMPONENT, f"install repository signing key {fpr} from {source}", (
            _tools_command(ctx),
            key_command(repo.key_url, repo.key_data, fpr, keyring, not debian, KEY_STAMP, repo.proxy))))

    if debian:
        url = split_credentials(ctx, repo.url, "mirror.url")[0]
        listing = f"# {HEADER}\ndeb [signed-by={APT_KEYRING}] {url} /\n"
        planned.append(file_change(ctx, COMPONENT, APT_LIST, listing, "NVIDIA package repository"))
    else:
        conf, mode = dnf_repo(ctx)
        planned.append(file_change(ctx, COMPONENT, DNF_REPO, conf, "NVIDIA package repository", mode=mode))

    planned = [change for change in planned if change is not None]
    yield from planned
    if planned:
        yield Change(COMPONENT, "refresh the package index (sources changed)", (ctx.pm.update(),))
