package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/access"
	"github.com/outbox-relay/outbox-relay/relay/sink"
)

// Admin configures the admin HTTP listeners and the dead-letter API.
type Admin struct {
	// Listen is the address of the listener for probes and metrics,
	// host:port; it also serves the dead-letter API unless APIListen is
	// set. Default :9780; empty turns the listener off.
	Listen string `koanf:"listen"`
	// APIListen, when set, is the address of a second listener that
	// serves the dead-letter API, which Listen then does not: probes and
	// metrics can be open to the cluster's monitoring while the API that
	// changes rows is reachable only from where operators work.
	APIListen string `koanf:"api_listen"`
	// Token is a bearer token the dead-letter API accepts, named admin in
	// the audit trail. A secret: set it with OUTBOX_ADMIN_TOKEN or in the
	// file, or put it in a file named by token_file.
	Token     string `koanf:"token"`
	TokenFile string `koanf:"token_file"`
	// TokensDir names a directory of tokens, one per file, each named by
	// its file (a mounted Kubernetes Secret with one key per holder). All
	// are accepted, beside Token: add a token, move its clients, remove
	// the old one. The audit records which one a change came with.
	TokensDir string `koanf:"tokens_dir"`
	// Roles grant each token its role, name=role: viewer (reads, payloads
	// hidden), reader (reads with payloads) or operator (also replays,
	// releases, edits, reroutes and discards), such as
	// [admin=operator, oncall=viewer]. A token without one is refused.
	Roles []string `koanf:"roles"`
	// TrustedProxies are the addresses (or CIDR ranges) of the proxies in
	// front of the admin listeners, such as an ingress, whose
	// X-Forwarded-For names the client: failed sign-ins are throttled by
	// the client's address rather than the proxy's.
	TrustedProxies []string `koanf:"trusted_proxies"`
	// OIDC signs people in to the console through an OpenID Connect
	// provider.
	OIDC AdminOIDC `koanf:"oidc"`
	// ConsoleTokenLogin lets a token sign in to the console. Turn it off
	// when people sign in through OIDC: tokens then serve the API alone.
	// Default true.
	ConsoleTokenLogin bool `koanf:"console_token_login"`
	// TLS serves the admin listeners over HTTPS.
	TLS AdminTLS `koanf:"tls"`
	// HistoryInterval is how often each replica adds its counts to the
	// console's per-minute history in the database: from a second to a
	// minute, dividing a minute. The history keeps one row a minute per
	// destination and replica however often it is written. Default 1m.
	HistoryInterval time.Duration `koanf:"history_interval"`

	tokenFromFile bool // Token was read from TokenFile
}

// AdminOIDC is the console's single sign-on: an OpenID Connect provider
// (Okta, Microsoft Entra ID, Keycloak, Google, Dex, …) with a
// confidential client for the console.
type AdminOIDC struct {
	// Issuer is the provider's issuer URL; setting it turns single
	// sign-on on.
	Issuer string `koanf:"issuer"`
	// ClientID and ClientSecret are the console's client at the
	// provider. ClientSecret is a secret: set it with its variable, or
	// put it in a file named by client_secret_file, read at each sign-in.
	ClientID         string `koanf:"client_id"`
	ClientSecret     string `koanf:"client_secret"`
	ClientSecretFile string `koanf:"client_secret_file"`
	// RedirectURL is the console's callback as the provider knows it:
	// https://host/console/oidc/callback.
	RedirectURL string `koanf:"redirect_url"`
	// Scopes are asked for. Default [openid, profile, email]; add the
	// one that brings the groups claim where the provider needs one.
	Scopes []string `koanf:"scopes"`
	// GroupsClaim is the claim that lists a person's groups, in the ID
	// token or else from the userinfo endpoint. Default groups.
	GroupsClaim string `koanf:"groups_claim"`
	// GroupRoles grant roles to groups, group=role, such as
	// [relay-operators=operator, support=viewer]; a person has the
	// greatest of their groups' roles, and whoever has none is not let in.
	GroupRoles []string `koanf:"group_roles"`
	// Name is how the login page names the provider. Default "single
	// sign-on".
	Name string `koanf:"name"`

	secretFromFile bool // ClientSecret was read from ClientSecretFile
}

// Enabled reports whether the console signs in through the provider.
func (o AdminOIDC) Enabled() bool { return o.Issuer != "" }

// Secret reads the client secret: client_secret_file again when the
// secret came from it.
func (o AdminOIDC) Secret() (string, error) {
	if o.secretFromFile {
		return sink.ReadSecretFile("admin.oidc.client_secret_file", o.ClientSecretFile)
	}
	return o.ClientSecret, nil
}

// Roles are GroupRoles, read; with every problem found.
func (o AdminOIDC) Roles() (map[string]access.Role, []string) {
	return access.ParseGrants("admin.oidc.group_roles", o.GroupRoles)
}

func (o AdminOIDC) problems() []string {
	if !o.Enabled() {
		if o.ClientID != "" || o.RedirectURL != "" || len(o.GroupRoles) > 0 {
			return []string{"admin.oidc is set, but admin.oidc.issuer is not: set the provider's issuer URL"}
		}
		return nil
	}
	var p []string
	url := func(setting, v, hint string) {
		u, err := neturl.Parse(v)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			p = append(p, fmt.Sprintf("%s: %q is not an http(s) URL (%s)", setting, v, hint))
		}
	}
	url("admin.oidc.issuer", o.Issuer, "the provider's issuer, such as https://login.example.com/realms/ops")
	if o.RedirectURL == "" {
		p = append(p, "admin.oidc.redirect_url is not set: give the console's callback, https://host/console/oidc/callback, as registered at the provider")
	} else {
		url("admin.oidc.redirect_url", o.RedirectURL, "such as https://relay.example.com/console/oidc/callback")
		if !strings.HasSuffix(o.RedirectURL, "/console/oidc/callback") {
			p = append(p, fmt.Sprintf("admin.oidc.redirect_url: %q must end in /console/oidc/callback, the console's callback", o.RedirectURL))
		}
	}
	if o.ClientID == "" {
		p = append(p, "admin.oidc.client_id is not set: give the console's client id at the provider")
	}
	if o.ClientSecret == "" && o.ClientSecretFile == "" {
		p = append(p, "admin.oidc.client_secret is not set: set OUTBOX_ADMIN_OIDC_CLIENT_SECRET or admin.oidc.client_secret_file")
	}
	if o.GroupsClaim == "" {
		p = append(p, "admin.oidc.groups_claim is empty: name the claim that lists groups (default groups)")
	}
	roles, rp := o.Roles()
	p = append(p, rp...)
	if len(roles) == 0 && len(rp) == 0 {
		p = append(p, "admin.oidc.group_roles is empty: nobody could sign in; grant roles to groups, as in relay-operators=operator")
	}
	return p
}

// AdminTLS is the admin listeners' server certificate.
type AdminTLS struct {
	// CertFile and KeyFile are a PEM certificate (with its chain) and
	// key. Both or neither.
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// Enabled reports whether the admin listeners serve HTTPS.
func (t AdminTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Load reads the certificate and key.
func (t AdminTLS) Load() (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("admin.tls: %w", err)
	}
	return cert, nil
}

// DefaultAdminListen is the admin listener's default address.
const DefaultAdminListen = ":9780"

// MinAdminToken is the shortest admin token accepted, in characters.
const MinAdminToken = 16

// AdminTokenName is the name under which the audit records admin.token.
const AdminTokenName = "admin"

// APIEnabled reports whether the dead-letter API is served: a token is
// configured.
func (a Admin) APIEnabled() bool { return a.Token != "" || a.TokenFile != "" || a.TokensDir != "" }

// tokenName is what a token's file may be called.
var tokenName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$`)

// ReadTokens reads the dead-letter API's tokens, by name, with the roles
// admin.roles grants them: admin.token (admin.token_file read again when
// the token came from it) and every file of admin.tokens_dir. Files whose
// names start with a dot are skipped: Kubernetes keeps its bookkeeping of
// a mounted Secret there. It returns every problem found; the tokens are
// usable only without any.
func (a Admin) ReadTokens() (map[string]access.Token, []string) {
	var p []string
	out := map[string]string{}
	token := a.Token
	if a.tokenFromFile && token != "" { // else Load reported the file's problem
		var err error
		if token, err = sink.ReadSecretFile("admin.token_file", a.TokenFile); err != nil {
			p = append(p, err.Error())
		}
	}
	if token != "" {
		if len(token) < MinAdminToken {
			p = append(p, fmt.Sprintf("admin.token is %d characters; use at least %d random ones", len(token), MinAdminToken))
		}
		out[AdminTokenName] = token
	}
	if a.TokensDir != "" {
		entries, err := os.ReadDir(a.TokensDir)
		if err != nil {
			p = append(p, "admin.tokens_dir: "+err.Error())
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			path := filepath.Join(a.TokensDir, name)
			if st, err := os.Stat(path); err != nil || st.IsDir() {
				continue // a dangling link or a directory holds no token
			}
			setting := "admin.tokens_dir: " + name
			switch t, err := sink.ReadSecretFile(setting, path); {
			case err != nil:
				p = append(p, err.Error())
			case !tokenName.MatchString(name):
				p = append(p, fmt.Sprintf("%s: name the file with letters, digits and . _ @ - (the audit records it)", setting))
			case name == AdminTokenName && token != "":
				p = append(p, fmt.Sprintf("%s: admin.token is already named %s", setting, AdminTokenName))
			case len(t) < MinAdminToken:
				p = append(p, fmt.Sprintf("%s: the token is %d characters; use at least %d random ones", setting, len(t), MinAdminToken))
			default:
				out[name] = t
			}
		}
		if err == nil && len(entries) > 0 && len(out) == 0 && len(p) == 0 {
			p = append(p, "admin.tokens_dir: "+a.TokensDir+" holds no token file")
		}
	}
	roles, rp := access.ParseGrants("admin.roles", a.Roles)
	p = append(p, rp...)
	tokens := make(map[string]access.Token, len(out))
	for name, t := range out {
		tokens[name] = access.Token{Value: t, Role: roles[name]}
		if roles[name] == 0 && len(rp) == 0 {
			p = append(p, fmt.Sprintf("admin.roles: token %s has no role; grant it one of %s, as in %s=viewer", name, access.RoleNames(), name))
		}
	}
	slices.Sort(p)
	if len(p) == 0 && len(out) > 0 {
		if _, err := access.NewTokens(tokens); err != nil {
			p = append(p, "admin tokens: "+err.Error())
		}
	}
	return tokens, p
}

// Proxies are TrustedProxies, read; with every problem found.
func (a Admin) Proxies() ([]netip.Prefix, []string) {
	var out []netip.Prefix
	var p []string
	for _, s := range a.TrustedProxies {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if addr, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
			continue
		}
		pre, err := netip.ParsePrefix(s)
		if err != nil {
			p = append(p, fmt.Sprintf("admin.trusted_proxies: %q is not an address or a CIDR range, such as 10.0.0.0/8", s))
			continue
		}
		out = append(out, pre.Masked())
	}
	return out, p
}

func (a Admin) problems() []string {
	var p []string
	_, pp := a.Proxies()
	p = append(p, pp...)
	listen := func(setting, addr, hint string) {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			p = append(p, fmt.Sprintf("%s: %q is not host:port (%s)", setting, addr, hint))
		}
	}
	if a.Listen != "" {
		listen("admin.listen", a.Listen, "use :9780 for every interface, empty to turn the listener off")
	}
	if a.APIListen != "" {
		listen("admin.api_listen", a.APIListen, "such as :9781, or empty to serve the API on admin.listen")
		switch {
		case a.APIListen == a.Listen && !strings.HasSuffix(a.Listen, ":0"):
			p = append(p, "admin.api_listen is admin.listen; leave it empty to serve the API there")
		case !a.APIEnabled() && !a.OIDC.Enabled():
			p = append(p, "admin.api_listen is set, but no token is: set admin.token, admin.token_file or admin.tokens_dir")
		}
	}
	if a.TokensDir != "" || a.tokenFromFile || a.Token != "" {
		_, tp := a.ReadTokens()
		p = append(p, tp...)
	}
	p = append(p, a.OIDC.problems()...)
	if !a.ConsoleTokenLogin && !a.OIDC.Enabled() {
		p = append(p, "admin.console_token_login is off, but admin.oidc is not set: nobody could sign in to the console")
	}
	if a.HistoryInterval < time.Second || a.HistoryInterval > time.Minute || time.Minute%a.HistoryInterval != 0 {
		p = append(p, fmt.Sprintf("admin.history_interval is %s; it must be from 1s to 1m and divide a minute (such as 5s, 15s, 30s)", a.HistoryInterval))
	}
	if a.TLS.Enabled() {
		if a.TLS.CertFile == "" || a.TLS.KeyFile == "" {
			p = append(p, "admin.tls: set both cert_file and key_file")
		} else if _, err := a.TLS.Load(); err != nil {
			p = append(p, err.Error())
		}
		if a.Listen == "" && a.APIListen == "" {
			p = append(p, "admin.tls is set, but no admin listener is")
		}
	}
	return p
}
