package kubeauth

import (
	"context"
	"fmt"
)

// The few fields of authentication.k8s.io/v1 TokenReview and
// authorization.k8s.io/v1 SubjectAccessReview the reviews use.

type tokenReview struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Spec       tokenReviewSpec   `json:"spec"`
	Status     tokenReviewStatus `json:"status,omitzero"`
}

type tokenReviewSpec struct {
	Token string `json:"token"`
}

type tokenReviewStatus struct {
	Authenticated bool     `json:"authenticated"`
	User          userInfo `json:"user"`
	Error         string   `json:"error"`
}

type userInfo struct {
	Username string              `json:"username"`
	UID      string              `json:"uid"`
	Groups   []string            `json:"groups"`
	Extra    map[string][]string `json:"extra"`
}

type subjectAccessReview struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Spec       sarSpec   `json:"spec"`
	Status     sarStatus `json:"status,omitzero"`
}

type sarSpec struct {
	NonResourceAttributes nonResourceAttributes `json:"nonResourceAttributes"`
	User                  string                `json:"user"`
	UID                   string                `json:"uid,omitempty"`
	Groups                []string              `json:"groups,omitempty"`
	Extra                 map[string][]string   `json:"extra,omitempty"`
}

type nonResourceAttributes struct {
	Path string `json:"path"`
	Verb string `json:"verb"`
}

type sarStatus struct {
	Allowed bool   `json:"allowed"`
	Denied  bool   `json:"denied"`
	Reason  string `json:"reason"`
}

const (
	tokenReviewsPath         = "/apis/authentication.k8s.io/v1/tokenreviews"
	subjectAccessReviewsPath = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
)

// review asks the API server who token is and whether that user may have the path.
func (a *Authorizer) review(ctx context.Context, token string) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	select {
	case a.sem <- struct{}{}:
	case <-ctx.Done():
		return Unavailable, fmt.Errorf("kubeauth: waiting for a review slot: %w", ctx.Err())
	}
	defer func() { <-a.sem }()

	a.reviews.Add(1)
	tr := tokenReview{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview", Spec: tokenReviewSpec{Token: token}}
	var trOut tokenReview
	if err := a.cfg.API.Do(ctx, "POST", tokenReviewsPath, tr, &trOut, maxAnswer); err != nil {
		return a.failed(fmt.Errorf("kubeauth: TokenReview: %w", err))
	}
	if !trOut.Status.Authenticated {
		a.recovered()
		return Unauthenticated, nil
	}
	u := trOut.Status.User
	a.reviews.Add(1)
	sar := subjectAccessReview{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview", Spec: sarSpec{
		NonResourceAttributes: nonResourceAttributes{Path: a.cfg.Path, Verb: a.cfg.Verb},
		User:                  u.Username, UID: u.UID, Groups: u.Groups, Extra: u.Extra,
	}}
	var sarOut subjectAccessReview
	if err := a.cfg.API.Do(ctx, "POST", subjectAccessReviewsPath, sar, &sarOut, maxAnswer); err != nil {
		return a.failed(fmt.Errorf("kubeauth: SubjectAccessReview of %.100q: %w", u.Username, err))
	}
	a.recovered()
	if sarOut.Status.Allowed {
		return Allowed, nil
	}
	a.log.Debug("metrics auth: not allowed", "user", u.Username, "path", a.cfg.Path, "verb", a.cfg.Verb)
	return Denied, nil
}

// failed logs the first failure of an outage.
func (a *Authorizer) failed(err error) (Decision, error) {
	if a.failing.CompareAndSwap(false, true) {
		a.log.Warn("metrics auth: the API server did not answer a review; scrapes without a cached decision get 503 until it does", "err", err)
	}
	return Unavailable, err
}

func (a *Authorizer) recovered() {
	if a.failing.CompareAndSwap(true, false) {
		a.log.Info("metrics auth: the API server answers reviews again")
	}
}
