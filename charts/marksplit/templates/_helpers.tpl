{{/*
The labels of the agent's objects: the same as deploy/'s, and no more, so
that the chart and `kubectl apply -k deploy/` make the same objects.
*/}}
{{- define "marksplit.labels" -}}
app.kubernetes.io/name: marksplit
app.kubernetes.io/component: agent
{{- end }}

{{/*
marksplit.linkName fails unless the kernel takes .value as a link name, as
the agent checks it (reconcile.LinkName): what values.schema.json cannot
say, that the limit is 15 bytes rather than characters.
*/}}
{{- define "marksplit.linkName" -}}
{{- if gt (len .value) 15 }}
{{- fail (printf "%s %q is longer than 15 bytes, the kernel's limit for a link name" .name .value) }}
{{- end }}
{{- end }}

{{/*
marksplit.mark fails unless the mark is inside the mask, as the agent checks
it (reconcile.MarkMask): values.schema.json has the form, the template the
bits. Bit by bit, as templates have no bitwise and.
*/}}
{{- define "marksplit.mark" -}}
{{- $parts := splitList "/" . }}
{{- $mark := int64 (first $parts) }}
{{- $mask := int64 (last $parts) }}
{{- range until 32 }}
{{- if and (eq (mod $mark 2) 1) (eq (mod $mask 2) 0) }}
{{- fail (printf "mark %q: the mask does not cover the mark (the agent refuses bits outside it)" $) }}
{{- end }}
{{- $mark = div $mark 2 }}
{{- $mask = div $mask 2 }}
{{- end }}
{{- end }}

{{/*
marksplit.shared fails when table or priority is one that Cilium or
Tailscale keep theirs in, unless allowShared, as the agent does
(reconcile.Table.Neighbour, reconcile.Priority.Neighbour): the agent would
remove what is there.
*/}}
{{- define "marksplit.shared" -}}
{{- if not .Values.allowShared }}
{{- $t := int64 .Values.table }}
{{- $p := int64 .Values.priority }}
{{- $owner := "" }}
{{- if or (and (ge $t 200) (le $t 202)) (eq $t 2004) (eq $t 2005) }}
{{- $owner = printf "table %d is Cilium's" $t }}
{{- else if eq $t 52 }}
{{- $owner = "table 52 is Tailscale's" }}
{{- else if or (eq $p 1) (and (ge $p 8) (le $p 10)) (eq $p 20) (eq $p 100) (and (ge $p 109) (le $p 112)) }}
{{- $owner = printf "priority %d is Cilium's" $p }}
{{- else if and (ge $p 5210) (le $p 5270) }}
{{- $owner = printf "priority %d is Tailscale's" $p }}
{{- end }}
{{- with $owner }}
{{- fail (printf "%s: the agent would remove what is there; choose another, or set allowShared: true" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
marksplit.args are the container's args: `run`, then --flag=value, in
deploy/daemonset.yaml's order.
*/}}
{{- define "marksplit.args" -}}
{{- include "marksplit.linkName" (dict "name" "tunnelLink" "value" .Values.tunnelLink) }}
{{- include "marksplit.mark" .Values.mark }}
{{- include "marksplit.shared" . }}
- run
- {{ printf "--tunnel-link=%s" .Values.tunnelLink | toJson }}
- {{ printf "--mark=%s" .Values.mark | toJson }}
- --table={{ int64 .Values.table }}
- --priority={{ int64 .Values.priority }}
{{- if .Values.allowShared }}
- --allow-shared=true
{{- end }}
{{- if .Values.peers.auto }}
- --peers=auto
{{- range .Values.pathMTU.declared }}
- {{ printf "--path-mtu=%s" . | toJson }}
{{- end }}
{{- if .Values.pathMTU.probe }}
- --path-mtu-probe=true
{{- end }}
{{- if not .Values.pathMTU.learn }}
- --path-mtu-learn=false
{{- end }}
{{- end }}
{{- range .Values.peers.prefixes }}
- {{ printf "--prefix=%s" . | toJson }}
{{- end }}
{{- with .Values.peers.underlayLink }}
{{- include "marksplit.linkName" (dict "name" "peers.underlayLink" "value" .) }}
{{- if eq . $.Values.tunnelLink }}
{{- fail (printf "peers.underlayLink %q is the tunnelLink: the underlay is the link the tunnel's packets leave by" .) }}
{{- end }}
- {{ printf "--underlay-link=%s" . | toJson }}
{{- end }}
{{- with .Values.protocol | toString }}
- {{ printf "--protocol=%s" . | toJson }}
{{- end }}
- {{ printf "--encryption=%s" .Values.encryption | toJson }}
- {{ printf "--uninstall-configmap=%s" .Values.uninstall.configMapName | toJson }}
- {{ printf "--cilium-namespace=%s" .Values.cilium.namespace | toJson }}
- {{ printf "--cilium-configmap=%s" .Values.cilium.configMapName | toJson }}
- {{ printf "--metrics-addr=%s" .Values.metrics.address | toJson }}
{{- with .Values.metrics.secureAddress }}
{{- $host := regexReplaceAll ":[0-9]+$" . "" }}
{{- if eq (regexFind "[0-9]+$" .) (regexFind "[0-9]+$" $.Values.metrics.address) }}
{{- if has $host (list "" "0.0.0.0" "[::]") }}
{{- fail (printf "metrics.secureAddress %q listens on every address, metrics.address %q among them: give them two ports" . $.Values.metrics.address) }}
{{- else if eq $host (regexReplaceAll ":[0-9]+$" $.Values.metrics.address "") }}
{{- fail (printf "metrics.secureAddress %q is metrics.address: give them two ports" .) }}
{{- end }}
{{- end }}
- {{ printf "--secure-metrics-addr=%s" . | toJson }}
{{- end }}
{{- if .Values.metrics.tls.secretName }}
{{- if not .Values.metrics.secureAddress }}
{{- fail "metrics.tls.secretName is the certificate of metrics.secureAddress, which is empty: set both, or neither" }}
{{- end }}
- --tls-cert-file={{ include "marksplit.tlsDir" . }}/tls.crt
- --tls-key-file={{ include "marksplit.tlsDir" . }}/tls.key
{{- end }}
{{- if not .Values.events.enabled }}
- --events=false
{{- end }}
- {{ printf "--log-format=%s" .Values.logFormat | toJson }}
{{- if .Values.nodeCondition.enabled }}
- --node-condition=MarkSplitReady
{{- end }}
{{- $extra := include "marksplit.extraFlags" $ | fromYaml }}
{{- range .Values.extraArgs }}
{{- $flag := regexReplaceAll "=.*$" . "" }}
{{- if has $flag (include "marksplit.valueFlags" $ | splitList " ") }}
{{- fail (printf "extraArgs: %s is set by a value of the chart (values.yaml), where it is checked; the agent takes the last of a flag given twice, so extraArgs may not set it: use the value instead" $flag) }}
{{- end }}
{{- $check := get $extra $flag }}
{{- if not $check }}
{{- fail (printf "extraArgs: %q is not a flag that extraArgs may set (only %s=VALUE): the agent would exit on every node" . (keys $extra | sortAlpha | join "=VALUE, ")) }}
{{- end }}
{{- $value := trimPrefix (printf "%s=" $flag) . }}
{{- if or (not (hasPrefix (printf "%s=" $flag) .)) (gt (len $value) (int $check.max)) (not (regexMatch $check.pattern $value)) }}
{{- fail (printf "extraArgs: %q: want %s=%s: the agent would refuse it and exit on every node" . $flag $check.want) }}
{{- end }}
- {{ toJson . }}
{{- end }}
{{- end }}

{{/*
marksplit.extraFlags are the agent's flags that extraArgs may set, each with
the values the agent takes (a pattern and a length in bytes, as the agent
checks them): any other extraArg would make the agent exit on every node, at
once (a flag it does not know, or --version) or a crash loop (a value it
refuses). deploy/chart_test.go holds every flag of `marksplit help` to this
list, valueFlags or its own list of flags that extraArgs may never set, and
runs the agent's own parsing on what the chart accepts.
*/}}
{{- define "marksplit.extraFlags" -}}
"--node-name":
  want: "a Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253)"
  pattern: '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'
  max: 253
{{- end }}

{{/*
marksplit.valueFlags are the agent's flags that a value of the chart sets
and checks: extraArgs may not set them (the agent takes the last of a flag
given twice, so one there would get past the checks). deploy/chart_test.go
holds this list to every flag the chart renders.
*/}}
{{- define "marksplit.valueFlags" -}}
--tunnel-link --mark --table --priority --allow-shared --peers --path-mtu --path-mtu-probe --path-mtu-learn --prefix --underlay-link --protocol --encryption --uninstall-configmap --cilium-namespace --cilium-configmap --metrics-addr --secure-metrics-addr --tls-cert-file --tls-key-file --events --log-format --node-condition
{{- end }}

{{/*
marksplit.tlsDir is where the Secret metrics.tls.secretName is mounted.
*/}}
{{- define "marksplit.tlsDir" -}}
/etc/marksplit/tls
{{- end }}

{{/*
marksplit.securePort is the port of metrics.secureAddress, the container's
port https-metrics; empty without a secure listener.
*/}}
{{- define "marksplit.securePort" -}}
{{- with .Values.metrics.secureAddress }}{{ regexFind "[0-9]+$" . | int }}{{ end }}
{{- end }}

{{/*
marksplit.image is the agent's image: repository:tag, the tag defaulting to
the chart's appVersion, and @digest after it when image.digest is set (as
kustomize writes an images entry with newTag and digest): the runtime pulls
by the digest, and the tag only says which release it is.
*/}}
{{- define "marksplit.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/*
marksplit.policyArgs are the args of marksplit.args that say the policy
(what `marksplit verify` and `cleanup` take), without run and the listeners.
*/}}
{{- define "marksplit.policyArgs" -}}
{{- range (include "marksplit.args" . | fromYamlArray) }}
{{- if regexMatch "^--(tunnel-link|mark|table|priority|allow-shared|peers|prefix|underlay-link|protocol)=" . }}
- {{ toJson . }}
{{- end }}
{{- end }}
{{- end }}
