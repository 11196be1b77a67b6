"""Realistic fake secrets and near-miss look-alikes, for the detector's tests and benchmark.

Every fake has the real format (prefix, alphabet, length, checksum where there
is one) but is made here from a seeded RNG or is a published test value, so
none of them is anybody's credential.  Each sits in the kind of sentence an
agent's memory holds.  The look-alikes are what a memory file is full of and
a careless detector flags: hashes, UUIDs, commit ids, paths, base64, versions.
"""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass

_RNG = random.Random(20261201)
_ALNUM = string.ascii_letters + string.digits
_URLSAFE = _ALNUM + "_-"
_HEX = "0123456789abcdef"


def _fake(alphabet: str, length: int) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(length))


def _b64url(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@dataclass(frozen=True)
class Planted:
    kind: str  # the detector kind expected
    secret: str  # the exact secret value, which must not survive redaction
    sentence: str  # the secret in context
    pii: bool = False


def _planted(kind: str, secret: str, template: str, *, pii: bool = False) -> Planted:
    return Planted(kind, secret, template.format(secret), pii)


_JWT = ".".join(
    [
        _b64url({"alg": "HS256", "typ": "JWT"}),
        _b64url({"sub": "user-8841", "name": "Dana", "iat": 1764547200}),
        _fake(_URLSAFE, 43),
    ]
)
_PEM_BODY = "\n".join(_fake(_ALNUM + "+/", 64) for _ in range(6))
_PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{_PEM_BODY}\n-----END RSA PRIVATE KEY-----"

# The 19 formats of issue 12, in the order it lists them.
PLANTED: tuple[Planted, ...] = (
    _planted(
        "openai_api_key",
        "sk-" + _fake(_ALNUM, 20) + "T3BlbkFJ" + _fake(_ALNUM, 20),
        "Set OPENAI_KEY to {} before running the eval.",
    ),
    _planted(
        "openai_api_key",
        "sk-proj-" + _fake(_URLSAFE, 74) + "T3BlbkFJ" + _fake(_URLSAFE, 74),
        "The project key is {} (rotate it monthly).",
    ),
    _planted(
        "anthropic_api_key",
        "sk-ant-api03-" + _fake(_URLSAFE, 93) + "AA",
        "Claude works with {} now.",
    ),
    _planted(
        "aws_access_key",
        "AKIA" + _fake(string.ascii_uppercase + "234567", 16),
        "aws configure: access key id {} region eu-west-1.",
    ),
    _planted(
        "aws_secret_key",
        _fake(_ALNUM + "/+", 18) + "Kq/" + _fake(_ALNUM, 19),
        "aws_secret_access_key = {}",
    ),
    _planted("github_token", "ghp_" + _fake(_ALNUM, 36), "Pushed with token {} to the fork."),
    _planted(
        "github_token",
        "github_pat_11"
        + _fake(string.ascii_uppercase + string.digits, 20)
        + "_"
        + _fake(_ALNUM, 59),
        "Fine-grained PAT: {}",
    ),
    _planted(
        "slack_token",
        "xoxb-"
        + _fake(string.digits, 12)
        + "-"
        + _fake(string.digits, 13)
        + "-"
        + _fake(_ALNUM, 24),
        "The bot posts to #ops using {} as its token.",
    ),
    _planted(
        "stripe_key",
        "sk_live_51" + _fake(_ALNUM, 97),
        "Charge the card with Stripe key {} in production.",
    ),
    _planted("jwt", _JWT, "Session cookie was {}; it expires tomorrow."),
    _planted("private_key", _PEM, "Deploy key below:\n{}\nInstall it on the runner."),
    _planted(
        "url_password",
        "Tr0ub4dor-3x",
        "Connect with postgres://app_user:{}@db.internal:5432/orders today.",
    ),
    _planted("password", "hunter2-Quartz!", "Config has password={} for the admin account."),
    _planted("email", "dana.whitfield@example.org", "Send the report to {} by Friday.", pii=True),
    _planted(
        "phone_number", "+1 415 555 0132", "Call the on-call lead at {} if it fails.", pii=True
    ),
    _planted("phone_number", "(212) 555-0187", "Her desk phone is {}.", pii=True),
    _planted(
        "card_number", "4111 1111 1111 1111", "Test purchase on card {} was declined.", pii=True
    ),
    _planted("card_number", "5555-5555-5555-4444", "Refund to {} approved.", pii=True),
    _planted("us_ssn", "078-05-1120", "Applicant SSN {} matched the record.", pii=True),
)

# Further well-known formats the detector covers (not counted in the 19).
PLANTED_EXTRA: tuple[Planted, ...] = (
    _planted("google_oauth_token", "ya29.a0Af" + _fake(_URLSAFE, 60), "Authorization: Bearer {}"),
    _planted(
        "bearer_token",
        _fake(_ALNUM, 28) + "9" + _fake(_ALNUM, 11),
        "curl -H 'Authorization: Bearer {}'",
    ),
    _planted("password", "s3cr3t-Value_42", 'export API_KEY="{}"'),
    _planted(
        "url_password",
        "Zr3d-q8NvT2wLk5Xp",  # a literal: the seeded fakes after it stay as they were
        "Set REDIS_URL=redis://:{}@localhost:6379/0 in the worker env.",
    ),
    _planted("password", "correct-horse-7", "the password is {}."),
    _planted("password", "Tr0ub4dor&3xq-Qv9", "cat .env\nPGPASSWORD={}\nPGHOST=db"),
    _planted("password", "Mq7!vR2#pLx9", "SMTP_PASS={}"),
    _planted("password", "Zk4$wN8@tHc1", "export DB_PASS='{}'"),
    _planted("password", "hT-pw-0x93kQ", "HTPASSWD={}"),
    _planted("password", "aDm1n-pw-77x", "ADMIN_PW: {}"),
    _planted("gitlab_token", "glpat-" + _fake(_URLSAFE, 20), "GitLab CI used {} for the mirror."),
    _planted("google_api_key", "AIza" + _fake(_URLSAFE, 35), "Maps key {} is restricted."),
    _planted("huggingface_token", "hf_" + _fake(_ALNUM, 34), "Downloaded the model with {}."),
    # Passwords given to command-line tools (literals: the seeded fakes after
    # them stay as they were), as agents' tool calls hold them.
    _planted(
        "password",
        "Ld4p-b1nd-Q7",
        "ldapsearch -x -D cn=admin,dc=example,dc=com -w {} -b dc=example,dc=com",
    ),
    _planted(
        "password",
        "P12-exp0rt!k",
        "openssl pkcs12 -export -in cert.pem -inkey key.pem -passout pass:{} -out cert.p12",
    ),
    _planted("password", "Fin&Sh4re-26", "smbclient //fileserver/finance -U alice%{} -c 'ls'"),
    _planted(
        "password", "M0ng0-adm1n", 'mongosh "mongodb://db.internal:27017/admin" -u admin -p {}'
    ),
    _planted("password", "Sh3ll-r00t-x", "mysqlsh root:{}@db.internal:3306 --sql"),
    _planted("password", "Ps-Cr3d;2026", '$cred = ConvertTo-SecureString "{}" -AsPlainText -Force'),
    _planted("password", "Ps-P1ped|2026", "'{}' | ConvertTo-SecureString -AsPlainText -Force"),
    _planted("password", "Ssh-3nv-9k2q", "SSHPASS={} sshpass -e ssh deploy@web1 uptime"),
    _planted("password", "R3d1s-3nv-77", "REDISCLI_AUTH={} redis-cli -h cache ping"),
    _planted(
        "password",
        "Ipm1-B0x-42",
        "ipmitool -I lanplus -H 10.0.4.21 -U ADMIN -P {} chassis power status",
    ),
    _planted("password", "Sq1-Sa-2026!", 'sqlcmd -S db.internal -U sa -P {} -Q "SELECT @@VERSION"'),
    _planted("password", "N3t-Us3-k8", "net use \\\\fileserver\\finance {} /user:CORP\\alice"),
    _planted("password", "Tr0ub&4dor9", "mysql -h db -u root -p{} app"),
    # A tool call's commands as a JSON array: the password ran into "ls -la".
    _planted("password", "Arr4y-Pw-31", '{{"commands": ["mysql -u root -p{}", "ls -la"]}}'),
    # Review r7secrets: Basic credentials as JSON, the tools' other password
    # arguments, Windows tools in capitals, openssl's other spellings.
    _planted(
        "basic_auth",
        "ZGVwbG95OlMzY3JldC1CYXNpYzc=",  # deploy:S3cret-Basic7
        '{{"headers": {{"Authorization": "Basic {}", "Accept": "application/json"}}}}',
    ),
    _planted(
        "password", "N3w-Ld4p-pw8", "ldappasswd -x -D cn=admin,dc=example,dc=com -W -s {} uid=bob"
    ),
    _planted("password", "R3d1s-R3q-55", "redis-cli -h cache CONFIG SET requirepass {}"),
    _planted("password", "R3d1s-4uth-9", "redis-cli -h cache AUTH {}"),
    _planted("password", "N3T-CAPS-k8", "NET USE Z: \\\\FS01\\SHARE {} /USER:CORP\\ALICE"),
    _planted(
        "password", "P12-3qu4ls!k", "openssl pkcs12 -export -in c.pem -passout=pass:{} -out a.p12"
    ),
    # XML, SQL, a piped password, a query string, FreeRDP.
    _planted("password", "Mvn-Dep10y-4x", "<server><id>nexus</id><password>{}</password></server>"),
    _planted("password", "Sq1-R0le-2026", "CREATE USER 'app'@'%' IDENTIFIED BY '{}';"),
    _planted("password", "Sud0-P1pe-77", "echo {} | sudo -S systemctl restart nginx"),
    _planted("password", "F0rm-P4ss-31", "curl -d 'user=alice&pass={}' https://intranet/login"),
    _planted("password", "Rdp-Us3r-k9", "xfreerdp /u:alice /p:{} /v:10.0.4.30 /cert:ignore"),
    # Session 8: redis-cli's prompt, a form value with a space, remote admin and
    # cloud CLIs, net user, a tool after an unlisted --flag, and more tools.
    _planted("password", "R3d1s-Pr0mpt-4", "127.0.0.1:6379> AUTH {}\nOK\n127.0.0.1:6379> KEYS *"),
    _planted("password", "Url3nc S3cret", 'curl --data-urlencode "password={}" https://sso/login'),
    _planted("password", "Ps3x3c-Adm!n", "psexec \\\\web1 -u CORP\\admin -p {} cmd /c ipconfig"),
    _planted("password", "Ev1l-W1nrm-7", "evil-winrm -i 10.0.4.40 -u administrator -p {}"),
    _planted(
        "password", "Az-L0gin-S3c", "az login --service-principal -u app-id -p {} --tenant t1"
    ),
    _planted("password", "0c-L0gin-D3v", "oc login -u developer -p {} https://api.ocp:6443"),
    _planted(
        "password",
        "H3lm-R3po-99",
        "helm repo add priv https://charts.acme --username ci --password {}",
    ),
    _planted("password", "N3t-Us3r-Add1", "net user svc_backup {} /add"),
    _planted("password", "Sud0-Fl4g-Pw", "sudo --reset-timestamp mysql -uroot -p{} -e 'select 1'"),
    _planted(
        "password",
        "K3yt00l-St0re",
        "keytool -importcert -keystore app.jks -storepass {} -file ca.pem",
    ),
    _planted("password", "0r4cle-T1ger", "sqlplus scott/{}@//db.internal:1521/orcl"),
    _planted("password", "Imp4ck3t-pw1", "impacket-psexec corp/admin:{}@10.0.4.41"),
    # Session 8's review (r8secrets): camelCase keys, redis-cli over a socket,
    # PowerShell's continuation, a batch file's redirections, a wrapper's boolean
    # flag, a password starting with "-", redis-server's options.
    _planted(
        "password", "H3lm-R00t-Pw7", "helm install db bitnami/mysql --set auth.rootPassword={}"
    ),
    _planted("password", "Gr4f-Adm1n-Pw", '{{"username": "admin", "adminPassword": "{}"}}'),
    _planted("password", "S0ck-R3d1s-Pw", "redis /run/redis/redis.sock> AUTH {}\nOK"),
    _planted(
        "password", "Az-B4ckt1ck-Pw", "az login --service-principal `\n  -u $appId `\n  -p {} `"
    ),
    _planted("password", "B4tch-N3t-Us3r", "net user svc_backup {} /add >nul 2>&1"),
    _planted("password", "Fl4tp4k-My5ql", "flatpak-spawn --host mysql -uroot -p{} app"),
    _planted(
        "password", "-D4sh-K3y5t0re", "keytool -genkeypair -alias a -storepass {} -keystore k"
    ),
    _planted(
        "password", "R3d1s-S3rv3r-Pw", "command: redis-server --requirepass {} --appendonly yes"
    ),
    _planted("email", "ops+alerts@mail.example.co.uk", "Alerts go to {}.", pii=True),
    _planted("iban", "GB82 WEST 1234 5698 7654 32", "Wire it to IBAN {}.", pii=True),
)

# Near misses: must not be flagged (at most 1 in 13 may be).
LOOKALIKES: tuple[str, ...] = (
    "sha256 of the tarball is " + _fake(_HEX, 64) + ".",
    "md5 checksum: " + _fake(_HEX, 32),
    "Request id 3f2b8c1e-9a4d-4e7b-8c2f-1d5e6a7b8c9d failed once.",
    "Fixed in commit " + _fake(_HEX, 40) + " on main.",
    "Short commit " + _fake(_HEX, 7) + " reverted the change.",
    "The config lives at /home/dana/.config/memd/memd.toml and /var/lib/memd/state.sqlite3.",
    "Embedded image data: "
    + base64.b64encode(bytes(_RNG.randrange(256) for _ in range(60))).decode(),
    "Upgraded litellm from 1.76.1 to 1.108.3; python 3.11.9.",
    "Image digest sha256:" + _fake(_HEX, 64) + " pulled.",
    "Build 2026.12.01-rc.3+build.20261201 shipped at 1764547200123 ms.",
    "See https://github.com/acme/memd/blob/" + _fake(_HEX, 40) + "/memd/llm.py#L120.",
    "max_tokens = 4000 and the token budget is 200000; the password field is required.",
    "Tracking number 1Z999AA10123456784 and order 2026-12-01-000042.",
    "Server at 10.0.12.7:8443 answered in 1234 ms; ISO date 2026-12-01T10:00:00+00:00.",
    "Object key uploads/2026/12/01/" + _fake(_ALNUM, 20) + ".png stored.",
    "Use the Bearer scheme described in RFC 6750 section 2.1.",
    # Prose about passwords, and test runners' PASS: the .env rules must not fire.
    "The password policy requires 12 characters; pass the salt, and the PW field is optional.",
    "CI summary: TESTS_PASS=true, ALL_PASS: yes, passwords: rotated monthly.",
    # Command lines near the ones that carry a password: ports, widths, prompts,
    # stand-ins, password sources that are no password.
    "docker run -d -p 8080:80 nginx && ipmitool -I lanplus -H 10.0.4.21 -p 623 -U ADMIN -E sensor",
    'scp -P 22 backup.sql deploy@web1:/tmp; sqlcmd -S db.internal -E -Q "SELECT 1"',
    "fold -w 80 notes.txt | column -c 120; ldapsearch -x -W -D cn=admin,dc=example,dc=com",
    "Tests pass: 212, lint pass: clean; openssl reads -passin env:KEY_PW, never pass: on a shared host.",
    '{"commands": ["mysql -u root -p", "ssh -p 2222 web1", "docker run -p 8080:80 nginx"]}',
    "net use Z: \\\\fileserver\\finance /persistent:yes; mongosh --port 27017 -u admin -p",
    "ConvertTo-SecureString $env:ADMIN_PW -AsPlainText -Force; SSHPASS=$DEPLOY_PW sshpass -e ssh web1",
    "REDISCLI_AUTH=$(cat /run/secrets/redis) redis-cli ping; smbclient -L //fileserver -U alice",
    # A container named like a tool, its port mapping; Basic named, not given;
    # redis-cli reading a setting; ldappasswd prompting.
    "docker run -d --name mongo -p 27017:27017 mongo:7 && docker run --link mongo -p 8080:8080 app",
    'Authorization: Basic authentication is required; {"Authorization": "Basic realm"}',
    "redis-cli CONFIG GET requirepass; redis-cli SET auth token123; ldappasswd -x -W -A -S uid=bob",
    "<password>${env.NEXUS_PW}</password>; users are identified by their e-mail address",
    "GET /report?tests=212&pass=1234&fail=0; echo done | sudo tee /etc/motd; cmdkey /list",
    # Session 8: redis-cli's prompt with no password, form data without one, the
    # new tools' other options and prompts, a tool's name as a naming option's value.
    "127.0.0.1:6379> AUTH\n(error) ERR wrong number of arguments for 'auth' command",
    'curl --data-urlencode "q=select a b" -d @body.json https://x; psexec -s -i cmd.exe',
    "net user alice /domain; az login --use-device-code; oc login --web https://api.ocp:6443",
    "docker run -d --hostname mysql -p3306:3306 mysql:8; sqlplus / as sysdba; 7z x -p a.7z",
    "keytool -list -keystore app.jks -storepass:env KS_PW; vault login -method=oidc",
    # Session 8's review: camelCase names that hold no password, a socket prompt
    # without AUTH, net user's query with redirections, a wrapper without a password,
    # keytool's options in a row, prose naming net user.
    '{"maxTokens": 4000, "showPassword": false, "hasSecret": true, "nextPageToken": null}',
    "redis /run/redis/redis.sock> PING\nPONG; net user alice /domain >nul 2>&1",
    "flatpak-spawn --host mysql -uroot -p app; keytool -storepass -keypass -keystore k.jks",
    "Checked the svc account with net user svc_backup today; ran vault login again",
)
